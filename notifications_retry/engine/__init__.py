"""The retry engine: a worker's ticks, from the claim of a due row to its committed outcome.

Its modules, from the top of its import layers (pyproject.toml, "engine's layers") down:

- ``.worker``: the loop of ticks under the cycle's advisory lock (``database.locks``: the lane's lock,
  or a share of its partitions), the wait between ticks, a graceful stop and the heartbeat file.
- ``.loop_tasks``: what the loop runs besides ticks (the outbox relay, housekeeping, the outbox gauges,
  which the command hands it), after each tick and in slices of the wait; a failed task backs off.
- ``.dispatcher``: one tick's scheduling loop, on the worker's thread: claim what can start soon,
  start sends (tasks of the send loop, which this thread runs while it waits), hand finished calls
  (``Finished``) and the records their channels can no longer send on.
- ``.claiming``: the tick's claims, on the send loop's connection (a second claim under way on a
  second one on a backlog of inline rows) or Django's, and taking in what each claim returned; their
  inverse, claimed records given back unsent (``GiveBack``: a stop, a lost lock, an open circuit, a
  throttle's pause), their attempt with them.
- ``.failover``: an attempt its channel's provider could not take, sent through the fallback channel
  (built by the dispatcher only once a channel with a fallback needs it).
- ``.wakeup``: when a looping worker wakes between ticks (a due row, a NOTIFY, the fallback poll).
- ``.executor``: one provider call for one record, and its answer turned into an outcome.
- ``.channels``: the lane's channels as the worker loads them before each tick (``ChannelSet``: the
  channels that cannot send reported), and each channel's provider and flow-control state kept across
  ticks: how many rows a channel claims and when a send may start.
- ``.completer``: the rule for when outcomes are committed (size or delay), their commit kept
  through a database outage, and its task on the send loop (``LoopCompleter``, on the loop's
  connection, in turn with the claims; a batch that needs Django's ORM goes through Django's).
- ``.tenant_limits``: per-tenant rate limits within a channel (``TENANT_RATE_LIMITS``): each tenant's
  cap on a claim, and the slot each of its records waits for.
- ``.failures``: what a tick that failed on the database reports, and the pause before the next one.
- ``.flow_control``: the rate limiter (a token bucket), the circuit breaker, the spacing of starts,
  what an outcome tells them (``FlowFeedback``: a throttle pauses the channel, failures open its
  circuit; the records it hands back, ``Returned``) and the worker's own cap on calls in flight
  across its channels (``InFlightCap``).
- ``.ports``: what a tick asks of the database (claim, release), a Protocol unit tests fake.
- ``.reporting``: a tick's stats, the metrics, log events and signal of each committed outcome, and
  after a tick its bookkeeping (``Bookkeeping``: the lane's heartbeat row, the backlog's gauges and
  sample at most every 10 s, and ``cycle-completed``).
"""
