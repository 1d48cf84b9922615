"""The retry engine.

worker (ticks, lock, signals), dispatcher (channel capacity), ownership (whether a send may start:
the cycle's lock seen held lately), executor (provider calls), completer (commits outcomes).
"""
