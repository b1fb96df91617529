"""plait's Python SDK: the whole REST API behind typed methods.

    from plait.client import Client
    with Client(["https://cp1:7070", "https://cp2:7070"], token="plait_...") as c:
        c.jobs.create(spec)                      # a dict, or a plait.model.JobSpec
        view = c.jobs.get("web")                 # a JobView (typed dict)
        print(view["serving"], view["settled"])

A client takes several URLs (the replicas of a control plane, or several front
ends) and fails over between them; a request refused with 503 during a leader
change, or that could not be sent, is retried with backoff (``stamina``), honouring
``Retry-After``. Imports are lazy (``httpx`` at the first request), so a command
built on it starts fast.
"""

from plait.client.client import ApiError, Client, Unreachable, from_config

__all__ = ["ApiError", "Client", "Unreachable", "from_config"]
