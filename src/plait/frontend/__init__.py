"""The region's front end over its scheduler shards (``plait frontend``: ``router``),
and the HTTP wire it shares with the shards' API (``plait.api``): a follower's proxy
and the hop to a leader, batches of creates, the request log."""
