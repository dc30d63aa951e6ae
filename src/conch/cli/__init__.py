"""conch.cli"""
