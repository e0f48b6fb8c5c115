//! The properties every store backend keeps, written once against the traits.
//!
//! The kernel's rules (one lease holder, fences that never repeat, a spend counted once, quota
//! windows, turn reservations, history pages) rest on these; a backend that passes them can sit
//! under the kernel. Each property is a function taking a factory that opens a new handle on one
//! fresh store (the first call creates it); [`run_all`] runs every one, and the test at the end
//! runs them against SQLite. A second backend adds one such test.

use std::sync::{Arc, Barrier};

use super::{Store, StoreRead, StoreTx};
use crate::model::{
    Claim, Goal, GoalStatus, JournalStatus, LedgerEntry, LedgerKind, Phase, Priority, Role, Run,
    Todo, TodoKind, TodoStatus, TurnRecord,
};

/// Opens a new handle on the store under test; every call reaches the same data.
pub(crate) type Factory<'a> = &'a (dyn Fn() -> Box<dyn Store> + Sync);

/// The factory of one store's handles, owned.
pub(crate) type StoreFactory = Box<dyn Fn() -> Box<dyn Store> + Sync>;

/// Makes a new, empty store and returns the factory of its handles.
pub(crate) type Fresh<'a> = &'a dyn Fn() -> StoreFactory;

/// One property: panics when the store under test breaks it.
type Property = fn(Factory<'_>);

/// Runs every property, each against a fresh store made by `fresh` (which returns the factory
/// of a new, empty store).
pub(crate) fn run_all(fresh: Fresh<'_>) {
    let properties: &[(&str, Property)] = &[
        ("claim race: one writer wins", claim_race_has_one_winner),
        ("fences", fences_survive_release_and_bind_only_while_live),
        (
            "idempotent spend",
            spend_with_the_same_effect_id_counts_once,
        ),
        ("quota window", quota_window_sums_at_its_boundaries),
        (
            "quota window kept as it moves",
            quota_window_equals_the_ledger_as_it_moves,
        ),
        (
            "spend series over the window",
            spend_series_buckets_the_window_and_nothing_else,
        ),
        (
            "reserved slots",
            unsettled_turns_reserve_slots_until_their_spend,
        ),
        ("journal", journal_upserts_and_lists_unsettled_turns),
        (
            "history paging",
            history_pages_newest_first_without_duplicates,
        ),
        ("read snapshots", a_rolled_back_write_leaves_nothing),
        (
            "commit counter",
            the_commit_counter_counts_commits_that_change_rows,
        ),
        (
            "monitors and deferrals",
            monitors_list_by_due_time_and_follow_their_todos,
        ),
        ("goal probes", goal_probes_round_trip_one_row_per_goal),
        (
            "retention",
            retention_compacts_only_settled_turns_and_reads_the_live_window,
        ),
    ];
    for (name, property) in properties {
        let factory = fresh();
        eprintln!("store conformance: {name}");
        property(&*factory);
    }
}

fn goal(id: &str) -> Goal {
    Goal {
        id: id.into(),
        title: format!("goal {id}"),
        objective: "o".into(),
        success_criteria: Vec::new(),
        status: GoalStatus::Active,
        project_dir: None,
        next_probe: None,
        created_at: 1,
        updated_at: 1,
    }
}

fn todo(goal_id: &str, id: &str) -> Todo {
    Todo {
        id: id.into(),
        goal_id: goal_id.into(),
        role: Role::Agent,
        kind: TodoKind::Task,
        title: format!("todo {id}"),
        detail: String::new(),
        priority: Priority::P1,
        status: TodoStatus::Open,
        depends_on: Vec::new(),
        capability: None,
        lane: None,
        gate_scope: None,
        claim: None,
        last_fence: 0,
        status_reason: None,
        created_at: 2,
        updated_at: 2,
    }
}

fn claim(agent_id: &str, fence: i64, expires_at: i64) -> Claim {
    Claim {
        agent_id: agent_id.into(),
        fence,
        expires_at,
        idempotency_key: format!("key-{agent_id}-{fence}"),
        claimed_at: 10,
    }
}

fn ledger(effect_id: &str, agent: &str, slots: i64, at: i64) -> LedgerEntry {
    LedgerEntry {
        effect_id: effect_id.into(),
        goal_id: "g".into(),
        agent_id: Some(agent.into()),
        run_id: None,
        slots,
        kind: if slots >= 0 {
            LedgerKind::Spend
        } else {
            LedgerKind::Void
        },
        voids_effect_id: None,
        created_at: at,
    }
}

fn turn(key: &str, agent: &str, todo_id: Option<&str>, phases: &[Phase], at: i64) -> TurnRecord {
    TurnRecord {
        turn_key: key.into(),
        goal_id: "g".into(),
        agent_id: agent.into(),
        todo_id: todo_id.map(str::to_owned),
        status: JournalStatus::InProgress,
        phases: phases.to_vec(),
        data: serde_json::json!({ "request": key }),
        created_at: at,
        updated_at: at,
        data_error: None,
    }
}

/// Runs `f` in one write transaction of `store` and commits it.
fn write(store: &mut dyn Store, f: impl FnOnce(&dyn StoreTx)) {
    let tx = store.begin_write().expect("begin write");
    f(&*tx);
    tx.commit().expect("commit");
}

/// Runs `f` in one read snapshot of `store`.
fn read<R>(store: &dyn Store, f: impl FnOnce(&dyn StoreRead) -> R) -> R {
    let tx = store.begin_read().expect("begin read");
    f(&*tx)
}

/// Two handles read an open todo and claim it at the same moment, each in its own write
/// transaction: the transactions serialize, so the second sees the first's claim and exactly
/// one claim is granted.
pub(crate) fn claim_race_has_one_winner(open: Factory<'_>) {
    let mut setup = open();
    write(&mut *setup, |tx| {
        tx.insert_goal(&goal("g")).unwrap();
        tx.insert_todo(&todo("g", "t1")).unwrap();
    });
    drop(setup);
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = ["a1", "a2"]
        .into_iter()
        .map(|agent| {
            let mut store = open();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let tx = store.begin_write().expect("begin write");
                let mut t = tx.todo("g", "t1").unwrap().expect("todo exists");
                let won = t.claim.is_none();
                if won {
                    t.last_fence += 1;
                    t.claim = Some(claim(agent, t.last_fence, 1_000_000));
                    t.status = TodoStatus::Claimed;
                    tx.update_todo(&t).unwrap();
                }
                tx.commit().expect("commit");
                (agent, won)
            })
        })
        .collect();
    let results: Vec<(&str, bool)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let winners: Vec<&str> = results.iter().filter(|r| r.1).map(|r| r.0).collect();
    assert_eq!(winners.len(), 1, "exactly one claim granted: {results:?}");
    let stored = read(&*open(), |tx| tx.todo("g", "t1").unwrap().unwrap());
    let held = stored.claim.expect("the winner's claim is stored");
    assert_eq!(held.agent_id, winners[0]);
    assert_eq!((held.fence, stored.last_fence), (1, 1));
}

/// A claim's fence and the highest fence ever granted come back exactly; a released todo keeps
/// its last fence; a claim binds (`claimed_by`, not `ready_todos`) only until it expires.
pub(crate) fn fences_survive_release_and_bind_only_while_live(open: Factory<'_>) {
    let mut store = open();
    let mut t = todo("g", "t1");
    write(&mut *store, |tx| {
        tx.insert_goal(&goal("g")).unwrap();
        tx.insert_todo(&t).unwrap();
    });
    t.claim = Some(claim("a1", 1, 100));
    t.last_fence = 1;
    t.status = TodoStatus::Claimed;
    write(&mut *store, |tx| tx.update_todo(&t).unwrap());
    read(&*store, |tx| {
        assert_eq!(tx.todo("g", "t1").unwrap().as_ref(), Some(&t));
        let held = tx.claimed_by("g", "a1", 99).unwrap().expect("live claim");
        assert_eq!(held.claim.unwrap().fence, 1);
        assert!(tx.claimed_by("g", "a2", 99).unwrap().is_none());
        assert!(tx.ready_todos("g", 99, 10).unwrap().is_empty());
        // At its expiry the claim no longer binds and the todo is claimable again.
        assert!(tx.claimed_by("g", "a1", 100).unwrap().is_none());
        let ready: Vec<String> = tx
            .ready_todos("g", 100, 10)
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect();
        assert_eq!(ready, ["t1"]);
    });
    // Released: the claim is gone, the fence it had is not.
    t.claim = None;
    t.status = TodoStatus::Open;
    write(&mut *store, |tx| tx.update_todo(&t).unwrap());
    let released = read(&*store, |tx| tx.todo("g", "t1").unwrap().unwrap());
    assert_eq!((released.claim, released.last_fence), (None, 1));
    // A re-grant carries the next fence; the store keeps exactly what it was given.
    t.claim = Some(claim("a1", 2, 500));
    t.last_fence = 2;
    t.status = TodoStatus::Claimed;
    write(&mut *store, |tx| tx.update_todo(&t).unwrap());
    let regranted = read(&*store, |tx| tx.todo("g", "t1").unwrap().unwrap());
    assert_eq!(regranted.claim.map(|c| c.fence), Some(2));
    assert_eq!(regranted.last_fence, 2);
}

/// A ledger row is keyed by its effect id: recording the same effect again writes nothing and
/// the window counts it once, even from another handle.
pub(crate) fn spend_with_the_same_effect_id_counts_once(open: Factory<'_>) {
    let mut store = open();
    write(&mut *store, |tx| {
        tx.insert_goal(&goal("g")).unwrap();
        assert!(tx.insert_ledger(&ledger("e1", "a1", 1, 100)).unwrap());
        assert!(!tx.insert_ledger(&ledger("e1", "a1", 1, 100)).unwrap());
    });
    let mut other = open();
    write(&mut *other, |tx| {
        let mut again = ledger("e1", "a2", 3, 200);
        again.run_id = Some("r".into());
        assert!(
            !tx.insert_ledger(&again).unwrap(),
            "a retried spend is refused"
        );
    });
    read(&*store, |tx| {
        assert_eq!(tx.spent_since("g", 0, None).unwrap(), 1);
        assert_eq!(
            tx.ledger_entry("e1").unwrap(),
            Some(ledger("e1", "a1", 1, 100))
        );
        assert_eq!(tx.recent_ledger("g", 10).unwrap().len(), 1);
    });
}

/// The window counts rows at or after its start (the boundary included, the millisecond before
/// it not), nets voids against spends, filters by agent, and names its oldest spend.
pub(crate) fn quota_window_sums_at_its_boundaries(open: Factory<'_>) {
    let mut store = open();
    write(&mut *store, |tx| {
        tx.insert_goal(&goal("g")).unwrap();
        tx.insert_goal(&goal("other")).unwrap();
        for entry in [
            ledger("before", "a1", 1, 999),
            ledger("at", "a1", 1, 1_000),
            ledger("after", "a2", 2, 1_001),
            ledger("void", "a2", -1, 1_002),
        ] {
            assert!(tx.insert_ledger(&entry).unwrap());
        }
        let mut elsewhere = ledger("elsewhere", "a1", 5, 1_000);
        elsewhere.goal_id = "other".into();
        assert!(tx.insert_ledger(&elsewhere).unwrap());
    });
    read(&*store, |tx| {
        assert_eq!(tx.spent_since("g", 1_000, None).unwrap(), 2, "1 + 2 - 1");
        assert_eq!(tx.spent_since("g", 999, None).unwrap(), 3);
        assert_eq!(tx.spent_since("g", 1_001, None).unwrap(), 1);
        assert_eq!(tx.spent_since("g", 1_003, None).unwrap(), 0);
        assert_eq!(tx.spent_since("g", 1_000, Some("a1")).unwrap(), 1);
        assert_eq!(tx.spent_since("g", 1_000, Some("a2")).unwrap(), 1);
        assert_eq!(tx.oldest_spend_since("g", 1_000).unwrap(), Some(1_000));
        assert_eq!(tx.oldest_spend_since("g", 1_001).unwrap(), Some(1_001));
        assert_eq!(
            tx.oldest_spend_since("g", 1_002).unwrap(),
            None,
            "a void frees no slot"
        );
    });
}

/// The spend series puts each ledger row dated in `[from, to)` in its equal span of that time
/// (the first millisecond in the first bucket, the last one in the last), nets voids against
/// spends, leaves out rows before `from`, at `to` and after, and other goals' rows, and sums to
/// what [`StoreRead::spent_since`] counts over the same rows.
pub(crate) fn spend_series_buckets_the_window_and_nothing_else(open: Factory<'_>) {
    let mut store = open();
    write(&mut *store, |tx| {
        tx.insert_goal(&goal("g")).unwrap();
        tx.insert_goal(&goal("other")).unwrap();
        for entry in [
            ledger("before", "a1", 7, 999),
            ledger("first", "a1", 1, 1_000),
            ledger("second", "a2", 2, 1_249),
            ledger("third", "a2", 3, 1_250),
            ledger("void", "a2", -3, 1_250),
            ledger("last", "a1", 4, 1_999),
            ledger("at-end", "a1", 8, 2_000),
        ] {
            assert!(tx.insert_ledger(&entry).unwrap());
        }
        let mut elsewhere = ledger("elsewhere", "a1", 5, 1_500);
        elsewhere.goal_id = "other".into();
        assert!(tx.insert_ledger(&elsewhere).unwrap());
    });
    read(&*store, |tx| {
        assert_eq!(
            tx.spend_series("g", 1_000, 2_000, 4).unwrap(),
            [3, 0, 0, 4],
            "1 + 2 in the first quarter; 3 - 3 in the second; 4 in the last"
        );
        let series = tx.spend_series("g", 1_000, 2_000, 48).unwrap();
        assert_eq!(series.len(), 48);
        assert_eq!(
            series.iter().sum::<i64>(),
            tx.spent_since("g", 1_000, None).unwrap() - 8,
            "the row at `to` is outside the series"
        );
        assert_eq!(tx.spend_series("g", 0, 3_000, 1).unwrap(), [22]);
        assert_eq!(tx.spend_series("other", 1_000, 2_000, 2).unwrap(), [0, 5]);
        assert_eq!(tx.spend_series("none", 1_000, 2_000, 3).unwrap(), [0, 0, 0]);
        assert!(tx.spend_series("g", 2_000, 1_000, 4).unwrap().is_empty());
        assert!(tx.spend_series("g", 1_000, 2_000, 0).unwrap().is_empty());
    });
}

/// However the store keeps the window's count, it equals the sum of the ledger rows at or after
/// the window's start: after spends (some with no agent), voids dated at the spend they cancel,
/// windows moved forward and back (a policy change) between writes, and reads asking for starts
/// on, before and after the last move and on every row's own millisecond.
pub(crate) fn quota_window_equals_the_ledger_as_it_moves(open: Factory<'_>) {
    let mut store = open();
    write(&mut *store, |tx| tx.insert_goal(&goal("g")).unwrap());
    let mut rows: Vec<LedgerEntry> = Vec::new();
    // A fixed linear congruential sequence: the same steps on every run and every backend.
    let mut seed: u64 = 0x5EED;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    let agents = ["a1", "a2", "a3"];
    let expected = |rows: &[LedgerEntry], since: i64, agent: Option<&str>| -> i64 {
        rows.iter()
            .filter(|e| e.created_at >= since)
            .filter(|e| agent.is_none_or(|a| e.agent_id.as_deref() == Some(a)))
            .map(|e| e.slots)
            .sum()
    };
    let mut clock = 1_000_i64;
    for step in 0..300 {
        clock += next(40) as i64;
        let since = clock - 200 + next(150) as i64 - 75;
        write(&mut *store, |tx| {
            let agent = agents[next(3) as usize];
            let spends: Vec<&LedgerEntry> = rows
                .iter()
                .filter(|e| e.kind == LedgerKind::Spend)
                .collect();
            let entry = if next(5) == 0 && !spends.is_empty() {
                let spend = spends[next(spends.len() as u64) as usize];
                let mut void = ledger(
                    &format!("void:{}", spend.effect_id),
                    "a1",
                    -spend.slots,
                    spend.created_at,
                );
                void.agent_id = spend.agent_id.clone();
                void
            } else {
                let mut spend = ledger(
                    &format!("e{step}"),
                    agent,
                    1 + next(3) as i64,
                    clock - next(3) as i64,
                );
                if next(7) == 0 {
                    spend.agent_id = None;
                }
                spend
            };
            tx.move_quota_window("g", entry.agent_id.as_deref(), since)
                .unwrap();
            if tx.insert_ledger(&entry).unwrap() {
                rows.push(entry);
            }
        });
        read(&*store, |tx| {
            let mut starts = vec![since, since - 1, since + 1, clock - 200, 0, clock + 1];
            starts.extend(rows.iter().rev().take(3).map(|e| e.created_at));
            for at in starts {
                for agent in [None, Some("a1"), Some("a2"), Some("a3"), Some("nobody")] {
                    assert_eq!(
                        tx.spent_since("g", at, agent).unwrap(),
                        expected(&rows, at, agent),
                        "step {step}: window from {at} for {agent:?}"
                    );
                }
            }
        });
    }
}

/// An unsettled turn holds a slot until it records its spend phase; settled turns and other
/// goals' turns hold none.
pub(crate) fn unsettled_turns_reserve_slots_until_their_spend(open: Factory<'_>) {
    let mut store = open();
    write(&mut *store, |tx| {
        tx.insert_goal(&goal("g")).unwrap();
        tx.insert_goal(&goal("other")).unwrap();
        tx.upsert_turn(&turn("k1", "a1", None, &[Phase::HostExecute], 1))
            .unwrap();
        tx.upsert_turn(&turn("k2", "a2", None, &[], 2)).unwrap();
        tx.upsert_turn(&turn(
            "k3",
            "a1",
            None,
            &[Phase::HostExecute, Phase::QuotaSpend],
            3,
        ))
        .unwrap();
        let mut settled = turn("k4", "a1", None, &[Phase::HostExecute], 4);
        settled.status = JournalStatus::Committed;
        tx.upsert_turn(&settled).unwrap();
        let mut elsewhere = turn("k5", "a1", None, &[], 5);
        elsewhere.goal_id = "other".into();
        tx.upsert_turn(&elsewhere).unwrap();
    });
    read(&*store, |tx| {
        assert_eq!(tx.reserved_slots("g", Some("a1")).unwrap(), (2, 1));
        assert_eq!(tx.reserved_slots("g", Some("a3")).unwrap(), (2, 0));
        assert_eq!(tx.reserved_slots("other", Some("a1")).unwrap(), (1, 1));
    });
    // Reaching the spend phase releases the reservation.
    write(&mut *store, |tx| {
        tx.upsert_turn(&turn(
            "k1",
            "a1",
            None,
            &[Phase::HostExecute, Phase::QuotaSpend],
            6,
        ))
        .unwrap()
    });
    read(&*store, |tx| {
        assert_eq!(tx.reserved_slots("g", Some("a1")).unwrap(), (1, 0));
    });
}

/// Upserting a turn row replaces its progress (todo, status, phases, data, update time) and
/// keeps its identity (goal, agent, creation time); what is read back is what was written.
/// Unsettled turns are listed oldest first and found by the todo they work.
pub(crate) fn journal_upserts_and_lists_unsettled_turns(open: Factory<'_>) {
    let mut store = open();
    let first = turn("k1", "a1", None, &[], 10);
    write(&mut *store, |tx| {
        tx.insert_goal(&goal("g")).unwrap();
        tx.insert_todo(&todo("g", "t1")).unwrap();
        tx.upsert_turn(&first).unwrap();
        tx.upsert_turn(&turn("k0", "a2", Some("t1"), &[], 5))
            .unwrap();
    });
    assert_eq!(
        read(&*store, |tx| tx.turn("k1").unwrap()),
        Some(first.clone())
    );
    let mut next = turn(
        "k1",
        "a1",
        Some("t1"),
        &[Phase::HostExecute, Phase::TypedResult],
        20,
    );
    next.created_at = 999; // ignored: a row keeps the time it was created
    next.data = serde_json::json!({ "request": "k1", "result": { "kind": "wait" } });
    write(&mut *store, |tx| tx.upsert_turn(&next).unwrap());
    let stored = read(&*store, |tx| tx.turn("k1").unwrap().unwrap());
    assert_eq!(stored.created_at, 10);
    assert_eq!(stored.updated_at, 20);
    assert_eq!(stored.phases, next.phases);
    assert_eq!(stored.data, next.data);
    assert_eq!(stored.todo_id.as_deref(), Some("t1"));
    read(&*store, |tx| {
        let keys: Vec<String> = tx
            .unsettled_turns(Some("g"))
            .unwrap()
            .into_iter()
            .map(|t| t.turn_key)
            .collect();
        assert_eq!(keys, ["k0", "k1"]);
        assert!(tx.unsettled_turn_on("g", "t1").unwrap().is_some());
    });
    let mut done = stored.clone();
    done.status = JournalStatus::Committed;
    done.updated_at = 30;
    write(&mut *store, |tx| tx.upsert_turn(&done).unwrap());
    read(&*store, |tx| {
        let keys: Vec<String> = tx
            .unsettled_turns(None)
            .unwrap()
            .into_iter()
            .map(|t| t.turn_key)
            .collect();
        assert_eq!(keys, ["k0"]);
        assert_eq!(
            tx.unsettled_turn_on("g", "t1").unwrap(),
            Some(("k0".to_owned(), "a2".to_owned()))
        );
        let committed = tx
            .recent_turns(Some("g"), Some(JournalStatus::Committed.as_str()), 10)
            .unwrap();
        assert_eq!(committed, [done.clone()]);
        assert_eq!(tx.turn("missing").unwrap(), None);
    });
}

/// History comes newest first in pages of `limit`; each page continues strictly before the
/// last id of the previous one, so the pages together hold every run exactly once. The newest
/// run's id is the goal's, or one agent's in that goal.
pub(crate) fn history_pages_newest_first_without_duplicates(open: Factory<'_>) {
    let mut store = open();
    // Ids sort in creation order (ULIDs do); several runs share a timestamp.
    let ids: Vec<String> = (0..7).map(|i| format!("01RUN{i:04}")).collect();
    write(&mut *store, |tx| {
        assert_eq!(tx.newest_run_id().unwrap(), None);
        tx.insert_goal(&goal("g")).unwrap();
        tx.insert_goal(&goal("other")).unwrap();
        for (i, id) in ids.iter().enumerate() {
            tx.insert_run(&Run {
                id: id.clone(),
                goal_id: "g".into(),
                agent_id: Some(if i % 2 == 0 { "a1" } else { "a2" }.into()),
                todo_id: None,
                classification: "progress".into(),
                outcome: None,
                summary: format!("run {i}"),
                payload: serde_json::json!({ "i": i }),
                created_at: 100 + (i as i64) / 3,
            })
            .unwrap();
        }
        tx.insert_run(&Run {
            id: "01RUN9999".into(),
            goal_id: "other".into(),
            agent_id: None,
            todo_id: None,
            classification: "progress".into(),
            outcome: None,
            summary: "elsewhere".into(),
            payload: serde_json::json!({}),
            created_at: 100,
        })
        .unwrap();
    });
    // The newest id is the greatest stored in any goal, and the next run's id sorts after it
    // even when the clock says otherwise.
    write(&mut *store, |tx| {
        assert_eq!(tx.newest_run_id().unwrap().as_deref(), Some("01RUN9999"));
    });
    let mut seen: Vec<String> = Vec::new();
    let mut before: Option<String> = None;
    loop {
        let page = read(&*store, |tx| tx.runs("g", 3, before.as_deref()).unwrap());
        assert!(page.len() <= 3);
        if page.is_empty() {
            break;
        }
        seen.extend(page.iter().map(|r| r.id.clone()));
        before = page.last().map(|r| r.id.clone());
    }
    let mut newest_first = ids.clone();
    newest_first.reverse();
    assert_eq!(seen, newest_first, "every run once, newest first");
    read(&*store, |tx| {
        assert_eq!(tx.run_count("g").unwrap(), 7);
        assert_eq!(tx.latest_run_id("g", None).unwrap(), Some(ids[6].clone()));
        assert_eq!(
            tx.latest_run_id("g", Some("a2")).unwrap(),
            Some(ids[5].clone())
        );
        assert_eq!(tx.latest_run_id("g", Some("a3")).unwrap(), None);
        assert_eq!(tx.latest_run_id("other", Some("a2")).unwrap(), None);
        assert_eq!(
            tx.run("g", &ids[2]).unwrap().map(|r| r.summary),
            Some("run 2".into())
        );
        assert_eq!(
            tx.run("other", &ids[2]).unwrap(),
            None,
            "a run belongs to its goal"
        );
    });
}

/// A write transaction dropped without commit leaves nothing, and a read snapshot opened inside
/// another on the same handle sees the same data.
pub(crate) fn a_rolled_back_write_leaves_nothing(open: Factory<'_>) {
    let mut store = open();
    write(&mut *store, |tx| tx.insert_goal(&goal("kept")).unwrap());
    {
        let tx = store.begin_write().unwrap();
        tx.insert_goal(&goal("dropped")).unwrap();
        tx.append_op(&super::OpRecord {
            id: "op".into(),
            goal_id: Some("dropped".into()),
            actor: "operator".into(),
            kind: "goal.create".into(),
            detail: serde_json::json!({}),
            created_at: 1,
        })
        .unwrap();
    }
    let outer = store.begin_read().unwrap();
    let inner = store.begin_read().unwrap();
    let ids = |tx: &dyn StoreRead| -> Vec<String> {
        tx.goals().unwrap().into_iter().map(|g| g.id).collect()
    };
    assert_eq!(ids(&*outer), ["kept"]);
    assert_eq!(ids(&*inner), ["kept"]);
    assert!(outer.ops(None, 10).unwrap().is_empty());
    drop(inner);
    assert_eq!(
        ids(&*outer),
        ["kept"],
        "the outer snapshot outlives the inner one"
    );
}

/// The commit counter rises by one with each commit that changed a row and appended at most one
/// operation, from any handle, and by nothing for a commit that changed none or a transaction
/// rolled back; a snapshot keeps the value it began with. Projections rely on it to know nothing
/// else committed since they were rendered.
pub(crate) fn the_commit_counter_counts_commits_that_change_rows(open: Factory<'_>) {
    use super::CommitSeq;
    let mut a = open();
    let mut b = open();
    let seq = |store: &dyn Store| read(store, |tx| tx.commit_seq().unwrap());
    let start = seq(&*a);
    let tx = a.begin_write().unwrap();
    tx.insert_goal(&goal("g")).unwrap();
    assert_eq!(tx.commit().unwrap(), start.next());
    assert_eq!(seq(&*b), start.next(), "another handle sees the count");

    let snapshot = a.begin_read().unwrap();
    assert_eq!(snapshot.commit_seq().unwrap(), start.next());
    let tx = b.begin_write().unwrap();
    tx.insert_todo(&todo("g", "t1")).unwrap();
    assert_eq!(tx.commit().unwrap(), CommitSeq(start.0 + 2));
    assert_eq!(
        snapshot.commit_seq().unwrap(),
        start.next(),
        "a snapshot keeps its count"
    );
    drop(snapshot);

    // Nothing changed, then a rollback: the count stays.
    let tx = b.begin_write().unwrap();
    assert!(tx.goal("g").unwrap().is_some());
    assert_eq!(tx.commit().unwrap(), CommitSeq(start.0 + 2));
    {
        let tx = a.begin_write().unwrap();
        tx.insert_goal(&goal("dropped")).unwrap();
    }
    assert_eq!(seq(&*a), CommitSeq(start.0 + 2));

    // A commit that logs its operation counts once, as does one that logs nothing; two
    // operations count at least twice, so a projection never takes them for one commit.
    let op = |id: &str| super::OpRecord {
        id: id.into(),
        goal_id: Some("g".into()),
        actor: "operator".into(),
        kind: "todo.add".into(),
        detail: serde_json::json!({}),
        created_at: 1,
    };
    let tx = a.begin_write().unwrap();
    tx.insert_todo(&todo("g", "t2")).unwrap();
    tx.append_op(&op("op1")).unwrap();
    assert_eq!(tx.commit().unwrap(), CommitSeq(start.0 + 3));
    assert_eq!(
        seq(&*b),
        CommitSeq(start.0 + 3),
        "the count a commit returns is the stored one"
    );
    let tx = b.begin_write().unwrap();
    tx.insert_todo(&todo("g", "t3")).unwrap();
    assert_eq!(tx.commit().unwrap(), CommitSeq(start.0 + 4));
    let tx = a.begin_write().unwrap();
    tx.append_op(&op("op2")).unwrap();
    tx.append_op(&op("op3")).unwrap();
    let two_ops = tx.commit().unwrap();
    assert!(two_ops > CommitSeq(start.0 + 5));
    assert_eq!(seq(&*b), two_ops);
    {
        let tx = b.begin_write().unwrap();
        tx.append_op(&op("op4")).unwrap();
    }
    let after_rollback = seq(&*b);
    let tx = b.begin_write().unwrap();
    tx.append_op(&op("op5")).unwrap();
    assert_eq!(tx.commit().unwrap(), after_rollback.next());
}

fn monitor(goal_id: &str, todo_id: &str, next_due_at: i64) -> crate::model::Monitor {
    crate::model::Monitor {
        goal_id: goal_id.into(),
        todo_id: todo_id.into(),
        every_ms: 1000,
        until_at: None,
        target: Some("metric".into()),
        follow_up: crate::model::MonitorFollowUp::OpenTodo,
        max_no_change: 3,
        probe: Some(crate::model::ProbeSpec {
            provider: "fs-observe/fs".into(),
            operation: "metric".into(),
            target: "m.txt".into(),
        }),
        next_due_at,
        last_check_at: None,
        last_digest: None,
        last_result: Some(crate::model::CheckResult::Baseline),
        no_change_count: 0,
        material_change: false,
        checks: 0,
        failures: 0,
        last_failure: None,
        check_seq: 0,
        checked_fence: 0,
        created_at: 1,
        updated_at: 1,
    }
}

/// A monitor reads back as written (an upsert replaces it); the active monitors are the ones
/// whose todo is not terminal, visited by due time, earliest first, until the visitor stops;
/// deferrals list by resume time for todos still deferred; the next lease expiry is the earliest
/// live one.
pub(crate) fn monitors_list_by_due_time_and_follow_their_todos(open: Factory<'_>) {
    let mut store = open();
    write(&mut *store, |tx| {
        tx.insert_goal(&goal("g")).unwrap();
        for (id, due) in [("a", 300), ("b", 100), ("c", 200)] {
            let mut t = todo("g", id);
            t.kind = TodoKind::Monitor;
            tx.insert_todo(&t).unwrap();
            tx.upsert_monitor(&monitor("g", id, due)).unwrap();
        }
        let mut done = todo("g", "c");
        done.kind = TodoKind::Monitor;
        done.status = TodoStatus::Archived;
        tx.update_todo(&done).unwrap();
        let mut changed = monitor("g", "a", 300);
        changed.no_change_count = 4;
        changed.last_digest = Some("d".into());
        tx.upsert_monitor(&changed).unwrap();
        for (id, status, until) in [
            ("x", TodoStatus::Deferred, 50),
            ("y", TodoStatus::Deferred, 40),
            ("z", TodoStatus::Open, 10),
        ] {
            let mut t = todo("g", id);
            t.status = status;
            tx.insert_todo(&t).unwrap();
            tx.set_deferral("g", id, Some(until)).unwrap();
        }
        tx.set_deferral("g", "x", Some(60)).unwrap();
        let mut leased = todo("g", "l");
        leased.status = TodoStatus::Claimed;
        leased.claim = Some(claim("ag", 1, 500));
        tx.insert_todo(&leased).unwrap();
    });
    read(&*store, |tx| {
        let a = tx.monitor("g", "a").unwrap().unwrap();
        assert_eq!(
            (a.no_change_count, a.last_digest.as_deref()),
            (4, Some("d"))
        );
        assert_eq!(a.probe, monitor("g", "a", 0).probe);
        assert_eq!(tx.monitors("g").unwrap().len(), 3);
        assert_eq!(tx.active_monitor_count("g").unwrap(), 2);
        let mut seen = Vec::new();
        tx.visit_active_monitors("g", &mut |m| {
            seen.push(m.monitor.todo_id.clone());
            Ok(true)
        })
        .unwrap();
        assert_eq!(
            seen,
            ["b", "a"],
            "by due time, the archived todo's monitor left out"
        );
        let mut first = Vec::new();
        tx.visit_active_monitors("g", &mut |m| {
            first.push(m.monitor.todo_id.clone());
            Ok(false)
        })
        .unwrap();
        assert_eq!(first, ["b"]);
        let due: Vec<(String, i64)> = tx
            .next_deferrals("g", 10)
            .unwrap()
            .into_iter()
            .map(|d| (d.todo_id, d.until_at))
            .collect();
        assert_eq!(due, [("y".to_string(), 40), ("x".to_string(), 60)]);
        assert_eq!(tx.deferral("g", "z").unwrap().map(|d| d.until_at), Some(10));
        assert_eq!(tx.next_lease_expiry("g", 100).unwrap(), Some(500));
        assert_eq!(tx.next_lease_expiry("g", 500).unwrap(), None);
    });
    write(&mut *store, |tx| tx.set_deferral("g", "y", None).unwrap());
    read(&*store, |tx| {
        assert_eq!(tx.deferral("g", "y").unwrap(), None)
    });
}

/// A goal's provider probe reads back as written, an upsert replaces it (one row per goal), other
/// goals keep theirs, and a delete removes only the goal's own.
pub(crate) fn goal_probes_round_trip_one_row_per_goal(open: Factory<'_>) {
    let probe = |goal_id: &str, revision: i64| crate::model::GoalProbe {
        goal_id: goal_id.into(),
        spec: crate::model::ProbeSpec {
            provider: "fs-observe/fs".into(),
            operation: "metric".into(),
            target: "m.txt".into(),
        },
        revision,
        ran_revision: 0,
        run_seq: 0,
        runs: 0,
        failures: 0,
        last_result: None,
        last_digest: None,
        last_checked_at: None,
        last_failure: None,
        last_observation: None,
        changed_at: None,
        created_at: 1,
        updated_at: 1,
    };
    let mut store = open();
    write(&mut *store, |tx| {
        tx.insert_goal(&goal("g")).unwrap();
        tx.insert_goal(&goal("h")).unwrap();
        tx.upsert_goal_probe(&probe("g", 1)).unwrap();
        tx.upsert_goal_probe(&probe("h", 1)).unwrap();
        let mut ran = probe("g", 2);
        ran.ran_revision = 2;
        ran.run_seq = 5;
        ran.runs = 4;
        ran.last_result = Some(crate::model::CheckResult::Changed);
        ran.last_digest = Some("d".into());
        ran.last_observation = Some("rps = 9".into());
        ran.last_checked_at = Some(7);
        ran.changed_at = Some(7);
        tx.upsert_goal_probe(&ran).unwrap();
    });
    read(&*store, |tx| {
        let g = tx.goal_probe("g").unwrap().unwrap();
        assert_eq!((g.revision, g.run_seq, g.runs), (2, 5, 4));
        assert_eq!(g.last_result, Some(crate::model::CheckResult::Changed));
        assert_eq!(g.last_observation.as_deref(), Some("rps = 9"));
        assert!(!g.pending());
        assert_eq!(tx.goal_probe("h").unwrap(), Some(probe("h", 1)));
        assert_eq!(tx.goal_probe("none").unwrap(), None);
    });
    write(&mut *store, |tx| tx.delete_goal_probe("g").unwrap());
    read(&*store, |tx| {
        assert_eq!(tx.goal_probe("g").unwrap(), None);
        assert!(tx.goal_probe("h").unwrap().is_some());
    });
}

/// The retention policy round-trips; a compaction changes a settled turn once and never an
/// unsettled one; the live window yields open todos and only the finished ones written since its
/// start; runs are found by creation time.
pub(crate) fn retention_compacts_only_settled_turns_and_reads_the_live_window(open: Factory<'_>) {
    use super::{ProjectedTodo, RetentionPolicy, for_each_live_projected_todo};
    let mut store = open();
    let policy = RetentionPolicy {
        live_window_days: 3,
        journal_full_days: 4,
        keep_journal_bodies: true,
        report_files_days: 5,
        history_days: 6,
    };
    let mut settled = turn("done", "a1", None, &[Phase::HostExecute], 10);
    settled.status = JournalStatus::Committed;
    write(&mut *store, |tx| {
        assert_eq!(tx.retention().retention_policy().unwrap(), None);
        tx.retention_tx().set_retention_policy(&policy, 1).unwrap();
        tx.insert_goal(&goal("g")).unwrap();
        for (id, status, at) in [
            ("open", TodoStatus::Open, 1),
            ("old", TodoStatus::Completed, 100),
            ("new", TodoStatus::Completed, 300),
            ("gone", TodoStatus::Archived, 50),
        ] {
            let mut t = todo("g", id);
            t.status = status;
            t.updated_at = at;
            tx.insert_todo(&t).unwrap();
        }
        tx.upsert_turn(&settled).unwrap();
        tx.upsert_turn(&turn("live", "a2", None, &[], 10)).unwrap();
        for (id, at) in [("01R1", 100), ("01R2", 200), ("01R3", 300)] {
            tx.insert_run(&Run {
                id: id.into(),
                goal_id: "g".into(),
                agent_id: None,
                todo_id: None,
                classification: "c".into(),
                outcome: None,
                summary: String::new(),
                payload: serde_json::json!({"big": "payload"}),
                created_at: at,
            })
            .unwrap();
        }
    });
    read(&*store, |tx| {
        assert_eq!(tx.retention().retention_policy().unwrap(), Some(policy));
        let keys: Vec<String> = (tx.retention().compactable_turns(11, 10).unwrap())
            .into_iter()
            .map(|c| c.turn_key)
            .collect();
        assert_eq!(
            keys,
            ["done"],
            "only settled turns, settled before the cut-off"
        );
        assert!(tx.retention().compactable_turns(10, 10).unwrap().is_empty());
        let mut seen = Vec::new();
        for_each_live_projected_todo(tx, "g", 1, 200, &mut |t| {
            seen.push(match t {
                ProjectedTodo::Cached(l) => l.json.to_string(),
                ProjectedTodo::Uncached(t, _) => t.id.clone(),
            });
            Ok(())
        })
        .unwrap();
        seen.sort();
        assert_eq!(seen, ["new", "open"]);
        let mut runs = Vec::new();
        tx.retention()
            .visit_runs_created_between("g", 150, 300, &mut |r| {
                runs.push(r.id.clone());
                Ok(())
            })
            .unwrap();
        assert_eq!(runs, ["01R2"]);
        assert_eq!(tx.retention().oldest_run_at("g").unwrap(), Some(100));
        assert_eq!(
            tx.retention().oldest_finished_todo_at("g").unwrap(),
            Some(50)
        );
        let mut finished = Vec::new();
        tx.retention()
            .visit_todos_finished_between("g", 0, 200, &mut |t| {
                finished.push(t.id.clone());
                Ok(())
            })
            .unwrap();
        assert_eq!(finished, ["gone", "old"]);
        let payloads = tx
            .retention()
            .runs_with_payload_before("g", 250, 10)
            .unwrap();
        assert_eq!(payloads.len(), 2);
    });
    let small = serde_json::json!({"compacted": {}});
    write(&mut *store, |tx| {
        assert!(!tx.retention_tx().compact_turn("live", &small, 20).unwrap());
        assert!(tx.retention_tx().compact_turn("done", &small, 20).unwrap());
        assert!(
            !tx.retention_tx().compact_turn("done", &small, 21).unwrap(),
            "once"
        );
        assert!(
            tx.retention_tx()
                .drop_run_payload("g", "01R1", &small, 20)
                .unwrap()
        );
        assert!(
            !tx.retention_tx()
                .drop_run_payload("g", "01R1", &small, 21)
                .unwrap()
        );
    });
    read(&*store, |tx| {
        assert_eq!(tx.turn("done").unwrap().unwrap().data, small);
        assert_eq!(tx.turn("live").unwrap().unwrap().data["request"], "live");
        assert!(
            tx.retention()
                .compactable_turns(i64::MAX, 10)
                .unwrap()
                .is_empty()
        );
        assert_eq!(tx.run("g", "01R1").unwrap().unwrap().payload, small);
        assert_eq!(
            tx.retention()
                .runs_with_payload_before("g", 250, 10)
                .unwrap()
                .len(),
            1
        );
    });
}

#[test]
fn sqlite_keeps_every_store_property() {
    let dirs = std::sync::Mutex::new(Vec::new());
    run_all(&|| {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("loopx.db");
        dirs.lock().unwrap().push(dir);
        Box::new(move || -> Box<dyn Store> {
            if db.exists() {
                super::open(super::Backend::Sqlite, &db).unwrap()
            } else {
                super::create(super::Backend::Sqlite, &db).unwrap()
            }
        })
    });
}

/// Every store can move to another thread (a server holds one per thread or a pool).
#[test]
fn every_store_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<Box<dyn Store>>();
}
