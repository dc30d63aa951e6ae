"""conch.web"""
