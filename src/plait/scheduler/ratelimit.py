"""A token bucket for destructive operations (stop, move, kill), one per shard."""

from __future__ import annotations


class TokenBucket:
    """``rate`` tokens per second up to ``burst``; time is passed in."""

    def __init__(self, rate: float, burst: float, now: float = 0.0) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.updated = now
        self.taken = 0

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now

    def take(self, now: float) -> bool:
        self.refill(now)
        if self.tokens >= 1:
            self.tokens -= 1
            self.taken += 1
            return True
        return False

    def take_many(self, count: int, now: float) -> bool:
        """Take ``count`` tokens at once, or none if there are fewer (the same tokens
        left as ``count`` single takes: whole tokens come off a float exactly)."""
        if not count:
            return True
        self.refill(now)
        if self.tokens < count:
            return False
        self.tokens -= count
        self.taken += count
        return True
