"""weft.hw"""
