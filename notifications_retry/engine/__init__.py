"""The retry engine.

worker (ticks, lock, signals), dispatcher (channel capacity), in_flight (the worker's cap on calls in
flight across its channels), ownership (whether a send may start:
the cycle's lock seen held lately), executor (provider calls), completer (commits outcomes).
"""
