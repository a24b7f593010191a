//! `--namespace` against the model etcd, as properties over random request sequences:
//!
//! - **equivalence**: a proxy with a namespace in front of a fresh model answers every request exactly as a fresh
//!   model without one answers it directly (errors by code and message, everything else message for message;
//!   watchers by their Created answers, their events and their cancels), and the model's history shows no key range
//!   named and no key written outside the prefix;
//! - **isolation**: two proxies with different namespaces on one model never see each other's keys: each answers as
//!   if it were alone on a fresh model (revisions aside, which the two share), watchers included, and each reaches
//!   only its own prefix.
//!
//! Keys come from a small alphabet that hits the edges: the empty key, `\0`, `\xff`, `\xff\xff`, keys that look like
//! the prefix or its end. Prefixes include ones ending in 0xff, ones of 0xff bytes only, and the empty one (no
//! namespace: the proxy is then plainly transparent).
//!
//! One turmoil world per case: the model members and the production proxies as `World` runs them, plus a fresh
//! model per namespace served directly as the reference; a client sends every request to both and compares. A case
//! is deterministic, the generator's seed is fixed (`SIM_SEED` picks another), and proptest shrinks a failure to a
//! short sequence and prints it with the command that reproduces it.

mod namespace_harness;

use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use proto::etcdserverpb::compare::{CompareResult, CompareTarget};
use proto::etcdserverpb::watch_create_request::FilterType;
use sim::check::namespace::show;

use namespace_harness::case::*;
use namespace_harness::run::{Mode, Subject, failure_text, generator_seed, run_case};

// ---------------------------------------------------------------------------------------------------------------
// Generators.

/// Prefixes one proxy may have: plain, ending in 0xff, of 0xff bytes only, with a NUL, and none at all.
const PREFIXES: &[&[u8]] = &[
    b"",
    b"/app/",
    b"p",
    b"a\xff",
    b"a\xff\xff",
    b"\xff",
    b"\xff\xff",
    b"\x00",
    b"n\x00s",
];

/// Pairs of namespaces of which neither is a prefix of the other (else one would rightly see the other's keys);
/// several are neighbours in key order (`t\xff` ends where `u` starts).
const NAMESPACE_PAIRS: &[(&[u8], &[u8])] = &[
    (b"t\xff", b"u"),
    (b"\xff\xff", b"\xff\xfe"),
    (b"/app/", b"/app0"),
    (b"\x00", b"\xff"),
    (b"a", b"b"),
];

/// Keys that sit on the edges of the keyspace and of `namespaces` namespaces (the empty key is drawn apart).
fn alphabet(namespaces: usize) -> Vec<Key> {
    let mut keys: Vec<Key> = [
        &b"\x00"[..],
        b"\x00\x00",
        b"a",
        b"a\x00",
        b"a\xff",
        b"ab",
        b"b",
        b"\xff",
        b"\xff\x00",
        b"\xff\xff",
    ]
    .iter()
    .map(|k| Key::Bytes(k.to_vec()))
    .collect();
    for n in 0..namespaces {
        keys.extend([Key::Prefix(n), Key::UnderPrefix(n), Key::PrefixEnd(n)]);
    }
    keys
}
const LEASES: [i64; 2] = [7, 8];

/// A key from the alphabet, or rarely the empty key (which etcd refuses, and one in a txn refuses all of it).
fn key(keys: &[Key]) -> BoxedStrategy<Key> {
    prop_oneof![
        1 => Just(Key::Bytes(Vec::new())),
        24 => prop::sample::select(keys.to_vec()),
    ]
    .boxed()
}

fn value() -> BoxedStrategy<Bytes> {
    prop::sample::select(vec![
        Bytes(Vec::new()),
        Bytes(b"v".to_vec()),
        Bytes(b"w".to_vec()),
    ])
    .boxed()
}

fn end(keys: &[Key]) -> BoxedStrategy<End> {
    prop_oneof![
        3 => Just(End::Single),
        2 => Just(End::FromKey),
        2 => Just(End::Prefix),
        2 => key(keys).prop_map(End::To),
    ]
    .boxed()
}

fn small_revision(mode: Mode) -> BoxedStrategy<i64> {
    match mode {
        Mode::Exact => prop_oneof![4 => Just(0i64), 1 => 1i64..6, 1 => Just(50i64)].boxed(),
        Mode::RevisionFree => Just(0i64).boxed(),
    }
}

fn range_op(keys: &[Key], mode: Mode) -> BoxedStrategy<RangeOp> {
    let filters = match mode {
        Mode::Exact => prop_oneof![
            3 => Just((0i64, 0i64, 0i64, 0i64)),
            1 => (0i64..4, 0i64..6, 0i64..4, 0i64..6),
        ]
        .boxed(),
        Mode::RevisionFree => Just((0i64, 0i64, 0i64, 0i64)).boxed(),
    };
    // Sorting by create or mod revision keeps one namespace's relative order even with another's writes between.
    (
        (key(keys), end(keys), small_revision(mode)),
        (
            prop_oneof![3 => Just(0i64), 1 => 1i64..3],
            (0i32..3, 0i32..5),
            any::<bool>(),
            prop::bool::weighted(0.2),
            any::<bool>(),
        ),
        filters,
    )
        .prop_map(
            |(
                (key, end, revision),
                (limit, sort, keys_only, count_only, serializable),
                filters,
            )| {
                RangeOp {
                    key,
                    end,
                    revision,
                    limit,
                    sort,
                    keys_only,
                    count_only,
                    serializable,
                    filters,
                }
            },
        )
        .boxed()
}

fn put_op(keys: &[Key], mode: Mode) -> BoxedStrategy<PutOp> {
    // Leases are cluster-wide (a namespace does not split them), so the isolation property leaves them out.
    let lease = match mode {
        Mode::Exact => {
            prop_oneof![6 => Just(0i64), 1 => prop::sample::select(LEASES.to_vec())].boxed()
        }
        Mode::RevisionFree => Just(0i64).boxed(),
    };
    (
        key(keys),
        value(),
        lease,
        any::<bool>(),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(key, value, lease, prev_kv, ignore_value, ignore_lease)| PutOp {
                key,
                value,
                lease,
                prev_kv,
                ignore_value,
                ignore_lease,
            },
        )
        .boxed()
}

fn delete_op(keys: &[Key]) -> BoxedStrategy<DeleteOp> {
    (key(keys), end(keys), any::<bool>())
        .prop_map(|(key, end, prev_kv)| DeleteOp { key, end, prev_kv })
        .boxed()
}

fn compare_op(keys: &[Key], mode: Mode) -> BoxedStrategy<CompareOp> {
    let targets = match mode {
        Mode::Exact => vec![
            CompareTarget::Version,
            CompareTarget::Create,
            CompareTarget::Mod,
            CompareTarget::Value,
            CompareTarget::Lease,
        ],
        Mode::RevisionFree => vec![CompareTarget::Version, CompareTarget::Value],
    };
    (
        key(keys),
        end(keys),
        prop::sample::select(targets),
        prop::sample::select(vec![
            CompareResult::Equal,
            CompareResult::NotEqual,
            CompareResult::Greater,
            CompareResult::Less,
        ]),
        prop_oneof![Just(0i64), 1i64..4, prop::sample::select(LEASES.to_vec())],
        value(),
    )
        .prop_map(|(key, end, target, result, number, value)| CompareOp {
            key,
            end,
            target,
            result,
            number,
            value,
        })
        .boxed()
}

fn txn_step(keys: &[Key], mode: Mode, depth: u32) -> BoxedStrategy<TxnStep> {
    let flat = prop_oneof![
        2 => range_op(keys, mode).prop_map(TxnStep::Range),
        3 => put_op(keys, mode).prop_map(TxnStep::Put),
        2 => delete_op(keys).prop_map(TxnStep::Delete),
    ];
    if depth == 0 {
        return flat.boxed();
    }
    prop_oneof![
        6 => flat,
        1 => txn_op(keys, mode, depth - 1).prop_map(TxnStep::Txn),
    ]
    .boxed()
}

fn txn_op(keys: &[Key], mode: Mode, depth: u32) -> BoxedStrategy<TxnOp> {
    (
        prop::collection::vec(compare_op(keys, mode), 0..3),
        prop::collection::vec(txn_step(keys, mode, depth), 0..3),
        prop::collection::vec(txn_step(keys, mode, depth), 0..3),
    )
        .prop_map(|(compare, success, failure)| TxnOp {
            compare,
            success,
            failure,
        })
        .boxed()
}

fn watch_op(keys: &[Key], mode: Mode) -> BoxedStrategy<WatchOp> {
    let start_revision = match mode {
        Mode::Exact => prop_oneof![3 => Just(0i64), 1 => 1i64..5].boxed(),
        Mode::RevisionFree => Just(0i64).boxed(),
    };
    (
        key(keys),
        end(keys),
        start_revision,
        any::<bool>(),
        prop_oneof![
            3 => Just(None),
            1 => Just(Some(FilterType::Noput as i32)),
            1 => Just(Some(FilterType::Nodelete as i32)),
        ],
    )
        .prop_map(|(key, end, start_revision, prev_kv, filter)| WatchOp {
            key,
            end,
            start_revision,
            prev_kv,
            filter,
        })
        .boxed()
}

fn op(keys: &[Key], mode: Mode) -> BoxedStrategy<Op> {
    let kv = prop_oneof![
        4 => range_op(keys, mode).prop_map(Op::Range),
        6 => put_op(keys, mode).prop_map(Op::Put),
        2 => delete_op(keys).prop_map(Op::Delete),
        3 => txn_op(keys, mode, 1).prop_map(Op::Txn),
        2 => watch_op(keys, mode).prop_map(Op::Watch),
    ];
    match mode {
        Mode::RevisionFree => kv.boxed(),
        Mode::Exact => {
            let lease = || prop::sample::select(LEASES.to_vec());
            prop_oneof![
                17 => kv,
                1 => lease().prop_map(Op::LeaseGrant),
                1 => lease().prop_map(Op::LeaseRevoke),
                1 => (lease(), any::<bool>()).prop_map(|(lease, keys)| Op::TimeToLive { lease, keys }),
                1 => (1i64..8).prop_map(Op::Compact),
            ]
            .boxed()
        }
    }
}

/// One proxy with a namespace from [`PREFIXES`], and its requests.
fn equivalence_case() -> impl Strategy<Value = Case> {
    let steps = prop::collection::vec(op(&alphabet(1), Mode::Exact).prop_map(|op| (0, op)), 1..40);
    (0u64..1000, prop::sample::select(PREFIXES.to_vec()), steps).prop_map(
        |(seed, prefix, steps)| Case {
            seed,
            namespaces: vec![b(prefix)],
            steps,
        },
    )
}

/// Two proxies with neighbouring namespaces on one model, and requests through either.
fn isolation_case() -> impl Strategy<Value = Case> {
    let steps = prop::collection::vec((0usize..2, op(&alphabet(2), Mode::RevisionFree)), 1..40);
    (
        0u64..1000,
        prop::sample::select(NAMESPACE_PAIRS.to_vec()),
        steps,
    )
        .prop_map(|(seed, (first, second), steps)| Case {
            seed,
            namespaces: vec![b(first), b(second)],
            steps,
        })
}

// ---------------------------------------------------------------------------------------------------------------
// Edges every run covers, whatever the generator draws.
/// Named request sequences that reach the edges of the keyspace, and of the (first) namespace's.
fn edge_sequences() -> Vec<(&'static str, Vec<Op>)> {
    let keys: Vec<Key> = vec![
        b"\x00".into(),
        b"\x00\x00".into(),
        b"a".into(),
        b"a\xff".into(),
        b"b".into(),
        b"\xff".into(),
        b"\xff\x00".into(),
        b"\xff\xff".into(),
        Key::Prefix(0),
        Key::UnderPrefix(0),
        Key::PrefixEnd(0),
    ];
    let mut reads: Vec<Op> = keys.iter().map(|k| put(k.clone())).collect();
    reads.extend([
        range(b"\x00", End::FromKey),
        Op::Range(RangeOp {
            limit: 2,
            sort: (2, 0),
            ..plain_range(b"\x00", End::FromKey)
        }),
        Op::Range(RangeOp {
            count_only: true,
            ..plain_range(b"\xff", End::FromKey)
        }),
        range(b"\xff", End::Prefix),
        range(b"a", End::Prefix),
        range(b"\x00", End::To(Key::from(b"\xff"))),
        range(b"\xff\xff", End::FromKey),
        range(b"b", End::To(Key::from(b"a"))),
        delete(b"\xff", End::FromKey),
        delete(b"a", End::Prefix),
        range(b"\x00", End::FromKey),
    ]);
    let refused_txn = |step: TxnStep| {
        Op::Txn(TxnOp {
            compare: Vec::new(),
            success: vec![step],
            failure: Vec::new(),
        })
    };
    let empty_keys = vec![
        range(b"", End::Single),
        range(b"", End::FromKey),
        put(b""),
        delete(b"", End::FromKey),
        Op::Txn(TxnOp {
            compare: vec![compare(
                b"",
                End::Single,
                CompareTarget::Version,
                CompareResult::Equal,
            )],
            success: Vec::new(),
            failure: Vec::new(),
        }),
        refused_txn(TxnStep::Put(plain_put(b""))),
        refused_txn(TxnStep::Range(plain_range(b"", End::FromKey))),
        refused_txn(TxnStep::Txn(TxnOp {
            compare: Vec::new(),
            success: Vec::new(),
            failure: vec![TxnStep::Delete(plain_delete(b"", End::Single))],
        })),
        // etcd checks a txn's operations in order: the Put's error comes before the empty key's.
        Op::Txn(TxnOp {
            compare: Vec::new(),
            success: vec![
                TxnStep::Put(PutOp {
                    ignore_value: true,
                    ..plain_put(b"a")
                }),
                TxnStep::Range(plain_range(b"", End::Single)),
            ],
            failure: Vec::new(),
        }),
    ];
    let txns = vec![
        put(b"a"),
        put(b"\xff"),
        Op::Txn(TxnOp {
            compare: vec![compare(
                b"\x00",
                End::FromKey,
                CompareTarget::Version,
                CompareResult::Greater,
            )],
            success: vec![
                TxnStep::Range(plain_range(b"\x00", End::FromKey)),
                TxnStep::Put(plain_put(b"b")),
                TxnStep::Txn(TxnOp {
                    compare: vec![compare(
                        b"\xff",
                        End::Prefix,
                        CompareTarget::Value,
                        CompareResult::Equal,
                    )],
                    success: vec![TxnStep::Delete(plain_delete(b"\xff", End::FromKey))],
                    failure: Vec::new(),
                }),
            ],
            failure: vec![TxnStep::Range(plain_range(b"a", End::Single))],
        }),
        Op::Txn(TxnOp {
            compare: vec![compare(
                b"a",
                End::Prefix,
                CompareTarget::Create,
                CompareResult::Less,
            )],
            success: Vec::new(),
            failure: vec![TxnStep::Delete(plain_delete(b"a", End::Prefix))],
        }),
        range(b"\x00", End::FromKey),
    ];
    let mut watchers = vec![
        watch(b"", End::Single, 0),
        watch(b"", End::FromKey, 0),
        watch(b"\x00", End::FromKey, 0),
        watch(b"\xff", End::Prefix, 0),
        watch(b"a", End::To(Key::from(b"\xff")), 0),
        watch(b"b", End::To(Key::from(b"a")), 0),
        watch(b"\xff\xff", End::FromKey, 0),
    ];
    watchers.extend(keys.iter().map(|k| put(k.clone())));
    watchers.push(delete(b"\x00", End::FromKey));
    let leases = vec![
        Op::LeaseGrant(7),
        leased_put(b"a", 7),
        leased_put(b"\xff", 7),
        leased_put(Key::UnderPrefix(0), 7),
        Op::TimeToLive {
            lease: 7,
            keys: true,
        },
        Op::LeaseRevoke(7),
        range(b"\x00", End::FromKey),
        Op::TimeToLive {
            lease: 7,
            keys: true,
        },
    ];
    let compaction = vec![
        put(b"a"),
        put(b"a"),
        put(b"a"),
        Op::Range(RangeOp {
            revision: 2,
            ..plain_range(b"a", End::Single)
        }),
        Op::Compact(3),
        Op::Range(RangeOp {
            revision: 2,
            ..plain_range(b"a", End::Single)
        }),
        Op::Range(RangeOp {
            revision: 3,
            ..plain_range(b"a", End::Single)
        }),
        watch(b"a", End::Single, 2),
        watch(b"a", End::Prefix, 3),
        put(b"a"),
        Op::Range(RangeOp {
            filters: (4, 0, 0, 0),
            ..plain_range(b"\x00", End::FromKey)
        }),
    ];
    vec![
        ("reads and deletes at the edges", reads),
        ("empty keys", empty_keys),
        ("txns over ranges, nested", txns),
        ("watchers of every shape", watchers),
        ("lease keys", leases),
        ("compaction and past revisions", compaction),
    ]
}

// ---------------------------------------------------------------------------------------------------------------
// The properties, the edges, and the harness checked against itself.

proptest! {
    // A case is a whole simulation (a fraction of a second of real time in a debug build).
    #![proptest_config(ProptestConfig {
        cases: 40,
        max_shrink_iters: 2048,
        max_shrink_time: 120_000,
        rng_seed: RngSeed::Fixed(generator_seed()),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_namespaced_proxy_answers_like_etcd_without_one_and_stays_in_its_prefix(case in equivalence_case()) {
        let violations = run_case(&case, Mode::Exact, Subject::Proxies);
        prop_assert!(
            violations.is_empty(),
            "{}",
            failure_text("a_namespaced_proxy_answers_like_etcd_without_one", &violations)
        );
    }

    #[test]
    fn proxies_with_different_namespaces_never_see_each_others_keys(case in isolation_case()) {
        let violations = run_case(&case, Mode::RevisionFree, Subject::Proxies);
        prop_assert!(
            violations.is_empty(),
            "{}",
            failure_text("proxies_with_different_namespaces_never_see_each_others_keys", &violations)
        );
    }
}

/// Runs each edge sequence through a proxy with each prefix of [`PREFIXES`]; reports every failing combination.
#[test]
fn edge_cases_answer_like_etcd_and_stay_in_the_prefix() {
    let mut failures = Vec::new();
    for prefix in PREFIXES {
        for (name, ops) in edge_sequences() {
            let case = Case {
                seed: 1,
                namespaces: vec![b(prefix)],
                steps: ops.into_iter().map(|op| (0, op)).collect(),
            };
            let violations = run_case(&case, Mode::Exact, Subject::Proxies);
            if !violations.is_empty() {
                failures.push(format!(
                    "{name}, namespace {}:\n  {}",
                    show(prefix),
                    violations.join("\n  ")
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "reproduce: cargo test -p sim --test namespace edge_cases\n{}",
        failures.join("\n")
    );
}

/// Neighbouring namespaces write the same client keys, watch everything, and delete everything.
#[test]
fn neighbouring_namespaces_keep_to_themselves() {
    let mut failures = Vec::new();
    for (a, b_ns) in NAMESPACE_PAIRS {
        let steps = vec![
            (0, watch(b"\x00", End::FromKey, 0)),
            (1, watch(b"", End::FromKey, 0)),
            (0, put(b"a")),
            (1, put(b"a")),
            (1, put(b"\xff")),
            (0, put(b"\x00")),
            (0, range(b"\x00", End::FromKey)),
            (1, delete(b"\x00", End::FromKey)),
            (0, range(b"\x00", End::FromKey)),
            (
                0,
                Op::Txn(TxnOp {
                    compare: vec![compare(
                        b"\x00",
                        End::FromKey,
                        CompareTarget::Version,
                        CompareResult::Equal,
                    )],
                    success: vec![TxnStep::Delete(plain_delete(b"a", End::Prefix))],
                    failure: vec![TxnStep::Range(plain_range(b"\x00", End::FromKey))],
                }),
            ),
            (1, put(b"b")),
        ];
        let case = Case {
            seed: 2,
            namespaces: vec![b(a), b(b_ns)],
            steps,
        };
        let violations = run_case(&case, Mode::RevisionFree, Subject::Proxies);
        if !violations.is_empty() {
            failures.push(format!(
                "namespaces {} and {}:\n  {}",
                show(a),
                show(b_ns),
                violations.join("\n  ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "reproduce: cargo test -p sim --test namespace neighbouring\n{}",
        failures.join("\n")
    );
}

proptest! {
    // The harness itself, without a proxy: a fresh model answers exactly like another, and one that holds a key
    // the other lacks is caught. Few cases: this checks the comparison, not the proxy.
    #![proptest_config(ProptestConfig {
        cases: 6,
        rng_seed: RngSeed::Fixed(generator_seed() ^ 1),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_harness_finds_a_fresh_model_equal_to_another(case in equivalence_case()) {
        let violations = run_case(&case, Mode::Exact, Subject::Direct { preloaded: false });
        prop_assert!(violations.is_empty(), "{}", failure_text("the_harness", &violations));
    }

    #[test]
    fn the_harness_tells_a_model_with_an_extra_key_from_a_fresh_one(case in equivalence_case()) {
        let violations = run_case(&case, Mode::Exact, Subject::Direct { preloaded: true });
        // Every header is a revision ahead, and at the latest the final read of everything shows the extra key.
        prop_assert!(
            violations.iter().any(|v| v.starts_with("step ")),
            "the extra key went unnoticed: {violations:?}"
        );
    }
}
