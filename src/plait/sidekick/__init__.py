"""Sidekick (paper section 2.6): host profiles. The agent side is the appliers
(``plait.sidekick.appliers``), which switch the machine they run on to a profile; the
control plane's book of targets and applied profiles is ``plait.sidekick.book``."""
