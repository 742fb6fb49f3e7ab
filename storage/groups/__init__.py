"""Consumer groups (Kafka's classic group protocol), coordinated by Kiln with state in Redis.

`model` and `membership` are I/O-free (the clock is passed in); `store` is the Redis
adapter; `coordinator` is the asyncio edge that owns timers and waiting members.
"""
