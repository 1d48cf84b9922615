"""The retry engine.

worker (ticks, lock, signals), dispatcher (channel capacity), executor (provider calls), completer
(commits outcomes).
"""
