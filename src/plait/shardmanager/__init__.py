"""Shard Manager: an application-level scheduler for sharded services, on TaskControl
(paper sections 2.5 and 2.8). The pure core: ``layout`` (where replicas go),
``batch`` (which tasks may go down together), ``controller`` (the TaskController);
the shell: ``service`` (the HTTP service that owns shard maps and calls the tasks)
and ``client`` (the library linked into a task)."""

from plait.shardmanager.batch import missing, safe_batch
from plait.shardmanager.controller import ShardController, ShardView
from plait.shardmanager.layout import Layout, Move, TaskPlace, assign, moves, rebalance

__all__ = ["Layout", "Move", "ShardController", "ShardView", "TaskPlace", "assign",
           "missing", "moves", "rebalance", "safe_batch"]
