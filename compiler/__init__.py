"""weft.compiler"""
