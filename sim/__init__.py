"""weft.sim"""
