"""The run directory, owned in one place: its schema (`schema`), its writers (`write`) and its reader (`read`).

Every producer (a live run's launcher and network server, `phantora replay`, `phantora netsim`) writes
through `phantora.results.write`; `phantora compare`, `phantora sweep` and the plots read through
`phantora.results.read.load_run`. This package sits below the bridge and the reports, so both can use it.
"""
