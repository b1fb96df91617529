"""A control plane's REST API (one scheduler shard's, or a whole region's when it is
not sharded): ``app.create_app`` builds it from one router module per resource, one
authentication dependency (``auth``) and the hot paths (``fastpaths``); every call into
the control plane goes through its facade (``plait.server.controlplane.facade``).
The region's front end over many shards is ``plait.frontend``."""
