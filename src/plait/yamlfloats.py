"""YAML's floats as people write them: PyYAML follows YAML 1.1, where a float needs
a dot, so ``1e6`` and ``5e-2`` are strings, and a number field refuses a string
(``plait.model.base.Input``). ``with_floats`` gives a loader class that reads them as
YAML 1.2 and JSON do."""

from __future__ import annotations

import re
from typing import Any

#: an exponent without a dot (``1e6``, ``-2E-3``): what YAML 1.1 leaves a string
EXPONENT = re.compile(r"^[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+$")


def with_floats(base: Any) -> Any:
    """A subclass of the loader class ``base`` that reads ``1e6`` as a float."""

    class Floats(base):  # type: ignore[misc]
        pass

    Floats.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT, list("-+0123456789"))
    return Floats
