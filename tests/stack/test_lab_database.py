"""The lab's PostgreSQL as configuration, without the lab (it needs root and namespaces: `make lab-test`
runs it, and each fault's bank check asks the running cluster what the application's role may do):
the application connects as its own role, not the superuser; the bootstrap makes that role with LOGIN
and CREATEDB only; Patroni is the pinned release with the leader key fix, the protections kept;
`lab test`'s summary reads each run's window."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from harness.lab import config, suite, topology
from harness.lab.topology import DB_HOSTS


def test_the_application_connects_as_its_own_role_not_the_superuser():
    url = urlsplit(topology.database_url())
    assert url.username == topology.APP_USER == "exchange"
    assert url.username != "postgres"
    assert urlsplit(topology.maintenance_url(DB_HOSTS[0])).username == "exchange"
    env = topology.app_env()
    assert urlsplit(env["DATABASE_URL"]).username == "exchange"


def test_the_bootstrap_makes_the_role_with_login_and_createdb_only_owning_the_database():
    conf = json.loads(config.patroni_yml(DB_HOSTS[0]))
    script = conf["bootstrap"]["post_bootstrap"]
    assert script == str(DB_HOSTS[0].dir / "post_bootstrap.sh")
    assert "users" not in conf["bootstrap"]  # removed in Patroni 4: the script survives an upgrade
    sql = config.post_bootstrap_sql()
    role = next(line for line in sql.splitlines() if line.startswith("CREATE ROLE"))
    assert "LOGIN CREATEDB NOSUPERUSER NOCREATEROLE NOREPLICATION" in role
    assert "CREATE DATABASE exchange OWNER exchange;" in sql
    text = config.post_bootstrap_script()
    assert text.startswith("#!/bin/sh\nset -e\n")
    assert "ON_ERROR_STOP=1" in text  # a failed statement fails the bootstrap
    assert sql in text


def test_patroni_is_the_pinned_release_with_the_leader_key_fix_and_the_protections_kept():
    major, minor, patch = (int(x) for x in topology.PATRONI_VERSION.split("."))
    assert (major, minor, patch) >= (3, 0, 3)  # patroni#2689: the leader key no longer overwritten
    assert (major, minor) < (3, 2)  # 3.2 raises ttl to at least 20 s: the killed primary's window doubles
    args = config.patroni_args(DB_HOSTS[1])
    assert args[-2] == str(topology.PATRONI_VENV / "bin" / "patroni")
    # etcd_wait.py, a module (not a `python -c` string), copied into the host's directory by write_files
    assert args[:2] == [config.SYSTEM_PYTHON, str(DB_HOSTS[1].dir / "etcd_wait.py")]
    assert "/usr/bin/patroni" not in " ".join(args)  # not Debian's 3.0.2
    conf = json.loads(config.patroni_yml(DB_HOSTS[1]))
    dcs = conf["bootstrap"]["dcs"]
    assert dcs["synchronous_mode"] is True
    assert dcs["synchronous_mode_strict"] is True
    assert dcs["check_timeline"] is True
    assert dcs["ttl"] == 10
    assert dcs["ttl"] >= dcs["loop_wait"] + 2 * dcs["retry_timeout"]
    assert conf["etcd3"]["use_proxies"] is True
    assert conf["etcd3"]["hosts"] == [f"{h.address}:2379" for h in DB_HOSTS if h != DB_HOSTS[1]]
    assert "--pre-vote" in config.etcd_args(DB_HOSTS[1])


def test_the_lab_tests_summary_reads_each_runs_window():
    assert suite.window_of("pg-kill", "... accepted again at +10.3 s after the fault") == "writes back +10.3 s"
    assert suite.window_of("sentinel-cut", "no transfer after the fault was refused or unanswered") == "no refusal"
    assert suite.window_of("pg-cut", "writes refused from +5.5 s to +9.0 s; NOT accepted again within the run") == (
        "NOT back"
    )
    beat = "beat: last run by app1 -0.4 s before the kill, first by app2 +9.9 s after (RedBeat's lock timeout"
    assert suite.window_of("hostfault", beat) == "beat taken over +9.9 s"
    assert suite.window_of("simulate", "end checks:\nRESULT: ok - the ledger balances") == "result ok"
    assert suite.window_of("simulate", "RESULT: BROKEN\n  PROBLEM: x") == "result BROKEN"
    results = [suite.Result("pg-kill", True, "writes back +10.3 s", 81.2), suite.Result("pg-cut", False, "-", 90.0)]
    text = suite.table(results, 12.0, 200.0)
    assert "pg-kill | PASS   | writes back +10.3 s | 81" in text
    assert "pg-cut  | FAIL" in text
    assert "1 of 2 passed in 200 s" in text
