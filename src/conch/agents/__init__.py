"""conch.agents"""
