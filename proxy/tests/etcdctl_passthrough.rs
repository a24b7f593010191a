//! The real `etcdctl` behaves the same through the proxy as against etcd directly.
//!
//! Each test starts two fresh single-member etcd clusters, one used directly and one behind
//! the proxy, runs the same sequence of `etcdctl` commands against both, and compares every
//! step's exit code, stdout and stderr after normalisation (see `testkit::normalize`). Because
//! both etcds are fresh and see the same writes, revisions are compared exactly (`<REV+n>` is
//! revision n).

mod support;

use support::compare::{Compare, Finish, Seen};

/// The first `<IDn>` placeholder in a normalised output.
fn placeholder(out: &str) -> String {
    let start = out
        .find("<ID")
        .unwrap_or_else(|| panic!("no ID placeholder in {out:?}"));
    let end = start + out[start..].find('>').expect("closing '>'") + 1;
    out[start..end].to_string()
}

/// The revision of a `-w json` header, which the normaliser writes `"revision":"<REV+N>"` (relative to 0: N).
fn header_revision(seen: &Seen) -> i64 {
    let tail = seen
        .stdout
        .split("\"revision\":\"<REV+")
        .nth(1)
        .unwrap_or_else(|| panic!("no normalised revision in {:?}", seen.stdout));
    let digits: String = tail.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().expect("revision number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_reads_writes_txn_and_compaction_match_direct_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let mut c = Compare::start(&binaries, &[]).await;

    for (k, v) in [
        ("foo", "bar"),
        ("foo1", "bar1"),
        ("foo2", "bar2"),
        ("zoo", "zzz"),
        ("foo", "bar-v2"),
        ("abc", "first"),
    ] {
        let seen = c.ok(&["put", k, v]).await;
        assert_eq!(seen.stdout, "OK\n");
    }

    // Reads in their many forms.
    let seen = c.ok(&["get", "foo"]).await;
    assert_eq!(seen.stdout, "foo\nbar-v2\n");
    c.ok(&["get", "foo", "-w", "json"]).await;
    let seen = c.ok(&["get", "foo", "--prefix"]).await;
    assert_eq!(seen.stdout, "foo\nbar-v2\nfoo1\nbar1\nfoo2\nbar2\n");
    c.ok(&["get", "foo1", "--from-key"]).await;
    c.ok(&["get", "foo", "--prefix", "--limit=2"]).await;
    c.ok(&["get", "foo", "--prefix", "--order=DESCEND"]).await;
    c.ok(&[
        "get",
        "",
        "--from-key",
        "--sort-by=MODIFY",
        "--order=DESCEND",
    ])
    .await;
    c.ok(&[
        "get",
        "",
        "--from-key",
        "--sort-by=CREATE",
        "--order=ASCEND",
    ])
    .await;
    c.ok(&[
        "get",
        "",
        "--from-key",
        "--sort-by=VALUE",
        "--order=DESCEND",
    ])
    .await;
    c.ok(&[
        "get",
        "",
        "--from-key",
        "--sort-by=VERSION",
        "--order=DESCEND",
        "--limit=3",
    ])
    .await;
    let seen = c.ok(&["get", "foo", "--rev=2"]).await;
    assert_eq!(seen.stdout, "foo\nbar\n");
    c.ok(&["get", "foo", "--prefix", "--keys-only"]).await;
    // etcdctl 3.4 has no --count-only; `count` and `more` show in JSON with a limit.
    let seen = c
        .ok(&["get", "foo", "--prefix", "--limit=1", "-w", "json"])
        .await;
    assert!(
        seen.stdout.contains("\"count\":3") && seen.stdout.contains("\"more\":true"),
        "{seen:?}"
    );
    let seen = c.ok(&["get", "foo", "--print-value-only"]).await;
    assert_eq!(seen.stdout, "bar-v2\n");
    c.ok(&["get", "foo", "--prefix", "-w", "json"]).await;
    c.ok(&["get", "foo", "--prefix", "--keys-only", "-w", "json"])
        .await;
    c.ok(&["get", "foo", "--consistency=s"]).await;
    let seen = c.ok(&["get", "no-such-key"]).await;
    assert_eq!(seen.stdout, "");
    c.ok(&["get", "no-such-key", "-w", "json"]).await;

    // Deletes.
    let seen = c.ok(&["del", "foo2", "--prev-kv"]).await;
    assert_eq!(seen.stdout, "1\nfoo2\nbar2\n");
    c.ok(&["del", "foo2"]).await;
    let seen = c.ok(&["del", "foo", "--prefix"]).await;
    assert_eq!(seen.stdout, "2\n");
    c.ok(&["get", "", "--from-key"]).await;
    c.ok(&["del", "zoo", "--prev-kv", "-w", "json"]).await;

    // Transactions, both branches, with every kind of compare.
    c.ok(&["put", "t1", "a"]).await;
    let success = "value(\"t1\") = \"a\"\nversion(\"t1\") = \"1\"\ncreate(\"t1\") > \"0\"\nmod(\"t1\") < \"1000\"\n\nput t2 yes\nget t1\n\nput t2 no\n\n";
    let seen = c.ctl_stdin(&["txn", "-i"], success).await;
    assert!(seen.stdout.contains("SUCCESS"), "{seen:?}");
    let failure = "value(\"t1\") = \"b\"\n\nput t3 yes\n\nput t3 no\nget t1\ndel t2\n\n";
    let seen = c.ctl_stdin(&["txn", "-i"], failure).await;
    assert!(seen.stdout.contains("FAILURE"), "{seen:?}");
    c.ctl_stdin(&["txn", "-i", "-w", "json"], failure).await;
    let by_version = "version(\"t3\") > \"1\"\n\nput t4 yes\n\nput t4 no\n\n";
    c.ctl_stdin(&["txn", "-i", "-w", "json"], by_version).await;
    let bad = "value(\"t1\" = \"a\"\n\n\n\n";
    c.ctl_stdin(&["txn", "-i"], bad).await;
    c.ok(&["get", "t", "--prefix", "-w", "json"]).await;

    // Compaction and reads of compacted revisions.
    let seen = c.ok(&["get", "t1", "-w", "json"]).await;
    let rev = header_revision(&seen);
    let compact_to = (rev - 2).to_string();
    let seen = c.ok(&["compaction", &compact_to]).await;
    assert_eq!(
        seen.stdout,
        format!("compacted revision <REV+{compact_to}>\n")
    );
    let seen = c.ctl(&["get", "t1", "--rev=2"]).await;
    assert_ne!(seen.code, Some(0));
    assert!(
        seen.stderr
            .contains("Error: etcdserver: mvcc: required revision has been compacted"),
        "{seen:?}"
    );
    c.ok(&["get", "t", "--prefix", &format!("--rev={compact_to}")])
        .await;
    let seen = c.ctl(&["compaction", &compact_to]).await;
    assert_ne!(seen.code, Some(0));
    let seen = c.ctl(&["get", "t1", &format!("--rev={}", rev + 100)]).await;
    assert!(
        seen.stderr.contains("future revision"),
        "reading a future revision must fail: {seen:?}"
    );
    c.ok(&["compaction", "--physical", &(rev - 1).to_string()])
        .await;
    let seen = c.ctl(&["watch", "t1", "--rev=1"]).await;
    assert!(
        seen.stderr.contains("required revision has been compacted"),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_match_direct_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let mut c = Compare::start(&binaries, &[]).await;
    let seen = c.ok(&["put", "w/a", "1", "-w", "json"]).await;
    let first = header_revision(&seen).to_string();
    let from_first = format!("--rev={first}");

    let mut prefix = c.spawn(&["watch", "w/", "--prefix", &from_first]);
    let mut prev_kv = c.spawn(&["watch", "w/a", "--prev-kv", &from_first]);
    let mut interactive = c.spawn(&["watch", "-i"]);
    interactive
        .write_stdin(&c, &format!("watch w/b {from_first}\n"))
        .await;

    c.ok(&["put", "w/a", "2"]).await;
    c.ok(&["put", "w/b", "3"]).await;
    c.ok(&["del", "w/a"]).await;
    c.ok(&["put", "w/c", "4"]).await;
    c.ok(&["put", "w/a", "end-a"]).await;
    c.ok(&["put", "w/b", "end-b"]).await;

    // JSON shows how events are batched into responses, which depends on timing for a
    // watcher that catches up while writes happen. This one starts after the writes, so its
    // catch-up is one response, and then it sees one live write.
    let mut json = c.spawn(&["watch", "w/", "--prefix", "-w", "json", &from_first]);
    json.wait_lines(1).await;
    c.ok(&["put", "w/d", "done"]).await;

    prefix.wait_contains("w/d\ndone").await;
    prev_kv.wait_contains("end-a").await;
    // "done" base64-encoded, as `-w json` prints values (raw output; the normaliser decodes them).
    json.wait_contains("ZG9uZQ==").await;
    interactive.wait_contains("end-b").await;

    let seen = c.finish(prefix, Finish::Terminate).await;
    assert_eq!(
        seen.stdout,
        "PUT\nw/a\n1\nPUT\nw/a\n2\nPUT\nw/b\n3\nDELETE\nw/a\n\nPUT\nw/c\n4\nPUT\nw/a\nend-a\nPUT\nw/b\nend-b\nPUT\nw/d\ndone\n"
    );
    c.finish(prev_kv, Finish::Terminate).await;
    c.finish(json, Finish::Terminate).await;
    let seen = c.finish(interactive, Finish::Terminate).await;
    assert_eq!(seen.stdout, "PUT\nw/b\n3\nPUT\nw/b\nend-b\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_locks_and_elections_match_direct_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let mut c = Compare::start(&binaries, &[]).await;

    // Lease life cycle; keys attached to a revoked lease are gone.
    let seen = c.ok(&["lease", "grant", "600"]).await;
    let lease = placeholder(&seen.stdout);
    assert_eq!(
        seen.stdout,
        format!("lease {lease} granted with TTL(600s)\n")
    );
    c.ok(&["put", &format!("--lease={lease}"), "lk1", "v1"])
        .await;
    c.ok(&["put", &format!("--lease={lease}"), "lk2", "v2"])
        .await;
    let seen = c.ok(&["lease", "timetolive", &lease, "--keys"]).await;
    assert!(seen.stdout.contains("attached keys([lk1 lk2])"), "{seen:?}");
    c.ok(&["lease", "timetolive", &lease, "-w", "json"]).await;
    let seen = c.ok(&["lease", "keep-alive", "--once", &lease]).await;
    assert_eq!(
        seen.stdout,
        format!("lease {lease} keepalived with TTL(600)\n")
    );
    c.ok(&["lease", "list"]).await;
    c.ok(&["lease", "list", "-w", "json"]).await;
    c.ok(&["get", "lk1", "-w", "json"]).await;
    c.ok(&["lease", "grant", "600", "-w", "json"]).await;
    let seen = c.ok(&["lease", "revoke", &lease]).await;
    assert_eq!(seen.stdout, format!("lease {lease} revoked\n"));
    let seen = c.ok(&["get", "lk", "--prefix"]).await;
    assert_eq!(seen.stdout, "", "keys of a revoked lease must be gone");
    c.ok(&["lease", "timetolive", &lease]).await;
    let seen = c.ctl(&["lease", "revoke", &lease]).await;
    assert_ne!(seen.code, Some(0));
    let seen = c.ctl(&["lease", "keep-alive", "--once", &lease]).await;
    assert_ne!(seen.code, Some(0));

    // Continuous keep-alive: a short TTL, so renewals come every second or so.
    let seen = c.ok(&["lease", "grant", "3"]).await;
    let short = placeholder(&seen.stdout);
    let mut keep = c.spawn(&["lease", "keep-alive", &short]);
    keep.wait_lines(2).await;
    let seen = c.finish(keep, Finish::KillKeepLines(2)).await;
    assert_eq!(
        seen.stdout,
        format!("lease {short} keepalived with TTL(3)\nlease {short} keepalived with TTL(3)\n")
    );
    c.ok(&["lease", "revoke", &short]).await;

    // Lock: a second locker blocks until the holder lets go.
    let mut holder = c.spawn(&["lock", "mylock"]);
    holder.wait_lines(1).await;
    let mut second = c.spawn(&["lock", "mylock", "echo", "second-got-it"]);
    c.wait_until(
        &["get", "mylock", "--prefix", "--keys-only"],
        "the second locker to queue behind the holder",
        |out| out.lines().filter(|l| !l.is_empty()).count() == 2,
    )
    .await;
    for (side, bg) in [("direct", &mut second.direct), ("proxy", &mut second.other)] {
        assert!(
            !bg.has_exited() && bg.stdout().is_empty(),
            "{side}: the second locker must wait while the lock is held; it printed {:?}",
            bg.stdout()
        );
    }
    let seen = c.finish(holder, Finish::Terminate).await;
    assert!(seen.stdout.starts_with("mylock/<ID"), "{seen:?}");
    let seen = c.finish(second, Finish::Exit).await;
    assert_eq!(
        seen.code,
        Some(0),
        "the second locker ran its command: {seen:?}"
    );
    assert_eq!(seen.stdout, "second-got-it\n");
    let seen = c.ok(&["get", "mylock", "--prefix"]).await;
    assert_eq!(seen.stdout, "", "every lock key is released");

    // Election: a campaigner wins, a listener sees the leader.
    let mut campaign = c.spawn(&["elect", "myelection", "proposal-1"]);
    campaign.wait_lines(2).await;
    let mut listen = c.spawn(&["elect", "-l", "myelection"]);
    listen.wait_lines(2).await;
    let seen = c.finish(listen, Finish::Terminate).await;
    assert!(seen.stdout.ends_with("\nproposal-1\n"), "{seen:?}");
    let seen = c.finish(campaign, Finish::Terminate).await;
    assert!(seen.stdout.ends_with("\nproposal-1\n"), "{seen:?}");
    let seen = c.ok(&["get", "myelection", "--prefix"]).await;
    assert_eq!(seen.stdout, "", "the campaigner resigned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_and_maintenance_commands_match_direct_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    // MemberList passes through unchanged only without an advertised URL (by default its client URLs are the
    // proxy's: see member_ids.rs).
    let mut c = Compare::start(&binaries, &["--advertise-client-url="]).await;
    c.ok(&["put", "a", "1"]).await;
    c.ok(&["put", "b", "2"]).await;

    let seen = c.ok(&["member", "list"]).await;
    assert!(seen.stdout.contains(", started, m0, "), "{seen:?}");
    c.ok(&["member", "list", "-w", "json"]).await;
    let seen = c.ok(&["endpoint", "status"]).await;
    assert!(seen.stdout.contains(", 3."), "{seen:?}");
    c.ok(&["endpoint", "status", "-w", "json"]).await;
    let seen = c.ok(&["endpoint", "health"]).await;
    // etcdctl 3.4 prints the health line on stderr, later ones on stdout.
    assert!(
        seen.stderr.contains("is healthy") || seen.stdout.contains("is healthy"),
        "{seen:?}"
    );
    c.ok(&["endpoint", "health", "-w", "json"]).await;

    let seen = c.ok(&["snapshot", "save", "<DIR>/snap.db"]).await;
    // etcdctl 3.6 and later add the server's storage version ("Server version 3.7.0"), the same through the proxy.
    assert!(
        seen.stdout.starts_with("Snapshot saved at <DIR>/snap.db\n"),
        "{seen:?}"
    );
    for t in [&c.direct, &c.other] {
        let file = t.dir.join("snap.db");
        let meta = std::fs::metadata(&file)
            .unwrap_or_else(|e| panic!("{}: snapshot file {}: {e}", t.name, file.display()));
        assert!(meta.len() > 0, "{}: empty snapshot file", t.name);
    }
    c.ok(&["snapshot", "status", "<DIR>/snap.db"]).await;
    c.ok(&["snapshot", "status", "<DIR>/snap.db", "-w", "json"])
        .await;

    let seen = c.ok(&["alarm", "list"]).await;
    assert_eq!(seen.stdout, "");
    let seen = c.ok(&["defrag"]).await;
    assert!(seen.stdout.contains("Finished defragmenting"), "{seen:?}");
    c.ok(&["get", "", "--from-key"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_permissions_and_denials_match_direct_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let mut c = Compare::start(&binaries, &[]).await;
    for step in [
        vec!["user", "add", "root:rootpw"],
        vec!["role", "add", "reader"],
        vec![
            "role",
            "grant-permission",
            "reader",
            "read",
            "/pub/",
            "--prefix=true",
        ],
        vec!["role", "add", "writer"],
        vec![
            "role",
            "grant-permission",
            "writer",
            "readwrite",
            "/pub/",
            "--prefix=true",
        ],
        vec!["user", "add", "alice:alicepw"],
        vec!["user", "grant-role", "alice", "reader"],
        vec!["user", "add", "bob:bobpw"],
        vec!["user", "grant-role", "bob", "writer"],
        vec!["put", "/pub/a", "public"],
        vec!["put", "/secret/s", "hidden"],
    ] {
        c.ok(&step).await;
    }
    let seen = c.ok(&["auth", "enable"]).await;
    assert_eq!(seen.stdout, "Authentication Enabled\n");

    const DENIED: &str = "Error: etcdserver: permission denied";
    // (user, may write /pub/)
    for (user, writer) in [("alice:alicepw", false), ("bob:bobpw", true)] {
        let u = format!("--user={user}");
        let seen = c.ctl(&["get", "/pub/a", &u]).await;
        assert_eq!(seen.code, Some(0), "{user} may read /pub/: {seen:?}");
        assert!(seen.stdout.starts_with("/pub/a\n"), "{seen:?}");
        let seen = c.ctl(&["get", "/secret/s", &u]).await;
        assert!(
            seen.stderr.contains(DENIED),
            "{user} may not read /secret/: {seen:?}"
        );
        let seen = c.ctl(&["put", "/pub/a", "changed", &u]).await;
        if writer {
            assert_eq!(seen.code, Some(0), "{user} may write /pub/: {seen:?}");
        } else {
            assert!(
                seen.stderr.contains(DENIED),
                "{user} may not write /pub/: {seen:?}"
            );
        }
        let seen = c.ctl(&["put", "/secret/s", "changed", &u]).await;
        assert!(
            seen.stderr.contains(DENIED),
            "{user} may not write /secret/: {seen:?}"
        );
        let seen = c.ctl(&["del", "/secret/s", &u]).await;
        assert!(
            seen.stderr.contains(DENIED),
            "{user} may not delete /secret/: {seen:?}"
        );
    }
    let seen = c.ctl(&["get", "/pub/a"]).await;
    assert!(
        seen.stderr
            .contains("Error: etcdserver: user name is empty"),
        "{seen:?}"
    );
    let seen = c.ctl(&["get", "/pub/a", "--user=alice:wrong"]).await;
    assert!(
        seen.stderr
            .contains("Error: etcdserver: authentication failed, invalid user ID or password"),
        "{seen:?}"
    );
    let seen = c
        .ctl(&["user", "add", "mallory:pw", "--user=alice:alicepw"])
        .await;
    assert!(seen.stderr.contains(DENIED), "{seen:?}");
    c.ok(&["get", "", "--from-key", "--user=root:rootpw"]).await;
    c.ok(&["role", "get", "reader", "--user=root:rootpw"]).await;
    c.ok(&["user", "list", "--user=root:rootpw"]).await;
    c.ok(&["user", "get", "bob", "--user=root:rootpw"]).await;
    let seen = c.ok(&["auth", "disable", "--user=root:rootpw"]).await;
    assert_eq!(seen.stdout, "Authentication Disabled\n");
    c.ok(&["get", "/secret/s"]).await;
}

/// `--worker-threads`: by default (0) as many workers as the process may use, with N that many; the main thread is
/// the first worker, each other one a thread named `worker-K`. The proxy serves the same with any number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_number_of_workers_serves_as_one_does() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    // The proxy runs in this process's cgroup and affinity mask, and so may use what this test may.
    let usable = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    for (flag, workers) in [
        ("--worker-threads=0", usable),
        ("--worker-threads=1", 1),
        ("--worker-threads=3", 3),
    ] {
        let mut c = Compare::start(&binaries, &[flag]).await;
        let seen = c.ok(&["put", "k", "v"]).await;
        assert_eq!(seen.stdout, "OK\n");
        let seen = c.ok(&["get", "k", "-w", "json"]).await;
        assert!(seen.stdout.contains("\"count\":1"), "{flag}: {seen:?}");
        let pid = c.proxy().expect("a proxy target").pid();
        let names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("the proxy's threads")
            .map(|task| {
                let comm = task.expect("a thread").path().join("comm");
                std::fs::read_to_string(comm).unwrap_or_default()
            })
            .collect();
        let worker_threads = names.iter().filter(|n| n.starts_with("worker-")).count();
        assert_eq!(
            worker_threads,
            workers - 1,
            "{flag}: threads {names:?}, expected the main thread and {} more workers",
            workers - 1
        );
    }
}
