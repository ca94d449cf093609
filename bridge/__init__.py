"""The ZeroMQ co-simulation bridge: wire protocol, coordinator, network server, rank client, launcher.

Start a run with `bridge.run.CosimRun`; a rank process talks to the coordinator through
`bridge.client.RankClient`. See docs/bridge.md.
"""
