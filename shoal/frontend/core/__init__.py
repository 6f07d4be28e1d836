"""The frontend's protocol-neutral core, which HTTP (``http/``) and gRPC (``grpc/``) adapt:
request validation (``validation``), documents (``documents``), request preparation
(``prepare``), the data plane to the broker (``dataplane``, ``dataplane_impl``), model lookup,
client shared-memory parameters and checks, header forwarding, model control and the logging
extension's settings."""
