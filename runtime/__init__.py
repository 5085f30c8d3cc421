"""weft.runtime"""
