"""Host profiles (paper section 2.6): ``book`` is the control plane's record of the
profile each machine must carry and the one its agent last reported applied (pure
core; the scheduler gates starts on it); ``store`` keeps profiles' versions in the
store; ``appliers`` switch the machine an agent runs on (record, sysctl, script)."""
