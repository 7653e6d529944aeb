"""Processes tfpar starts on this host, for the launcher and the runtime alike: process groups and
a watchdog (`processes`), the loopback library that keeps a local job's servers on 127.0.0.1
(`loopback`), and one TensorFlow server, ``python -m tfpar._local.server`` (`server`)."""

__all__: list[str] = []
