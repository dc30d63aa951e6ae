"""conch.inference"""
