"""BLS (Business Logic Scripting): a worker calling other models of the same server
(docs/architecture.md §7).

For the broker a BLS-calling worker is one more frontend: ``client.BlsClient`` places the inputs
in the worker's own BLS arena, sends ``InferRequest``s on a DEALER socket connected to the
broker's frontend ROUTER, and receives references to the callee's outputs, which the model gets
as numpy views (``memory``) whose lease is returned once the last view is gone. ``link`` owns
that socket (one thread); ``requests`` checks and builds the requests (pure but for one copy).
Nothing here knows about ``pb_utils``: the python backend adapts it (``pb_bls``).
"""
