//! Tests of the SQLite backend's own choices (query plans, the WAL's life, the projection
//! cache's encoding); the properties every backend keeps are in `store::conformance`.

use super::projection_cache::{pack_view_key, unpack_view_key};
use super::todos::OPEN_USER_TODO_IDS;
use super::*;

/// Goal `g`, the fixture of this backend's unit tests (here and in the modules' own tests).
pub(super) fn goal() -> Goal {
    Goal {
        id: "g".into(),
        title: "G".into(),
        objective: "o".into(),
        success_criteria: Vec::new(),
        status: GoalStatus::Active,
        project_dir: None,
        next_probe: None,
        created_at: 1,
        updated_at: 1,
    }
}

fn todo(id: &str, priority: Priority, capability: Option<&str>, claimed: bool) -> Todo {
    Todo {
        id: id.into(),
        goal_id: "g".into(),
        role: Role::Agent,
        kind: TodoKind::Task,
        title: format!("title of {id}"),
        detail: if claimed {
            "long detail".into()
        } else {
            String::new()
        },
        priority,
        status: if claimed {
            TodoStatus::Claimed
        } else {
            TodoStatus::Open
        },
        depends_on: Vec::new(),
        capability: capability.map(str::to_owned),
        lane: None,
        gate_scope: None,
        claim: claimed.then(|| Claim {
            agent_id: "a1".into(),
            fence: 3,
            expires_at: 9_000,
            idempotency_key: "k".into(),
            claimed_at: 1_000,
        }),
        last_fence: if claimed { 3 } else { 0 },
        status_reason: claimed.then(|| "busy".to_owned()),
        created_at: 5,
        updated_at: 6,
    }
}

/// Rows are visited in key order ("t10" before "t9") into one reused `Todo`; `todos()` must
/// still come out by priority then creation, and no field may leak from one row to the next.
#[test]
fn todos_come_in_listing_order_and_reused_rows_do_not_leak() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
    let created = [
        todo("t9", Priority::P2, Some("cap.a"), true),
        Todo {
            depends_on: vec!["t3".into(), "t9".into()],
            ..todo("t10", Priority::P2, None, false)
        },
        todo("t2", Priority::P0, None, false),
        todo("t1", Priority::P4, Some("cap.b"), false),
        todo("t3", Priority::P0, None, true),
    ];
    {
        let tx = store.begin_write().unwrap();
        tx.insert_goal(&goal()).unwrap();
        for t in &created {
            tx.insert_todo(t).unwrap();
        }
        tx.commit().unwrap();
    }
    let tx = store.begin_read().unwrap();
    let listed = tx.todos("g").unwrap();
    let ids: Vec<&str> = listed.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["t2", "t3", "t9", "t10", "t1"]);
    for t in &listed {
        let original = created.iter().find(|c| c.id == t.id).unwrap();
        assert_eq!(t, original, "{} read back exactly", t.id);
    }
    let mut visited = Vec::new();
    tx.for_each_todo("g", &mut |t, order| {
        visited.push((order, t.clone()));
        Ok(())
    })
    .unwrap();
    visited.sort_by_key(|(order, _)| *order);
    let visited: Vec<Todo> = visited.into_iter().map(|(_, t)| t).collect();
    assert_eq!(visited, listed);
}

/// The queries that pick a few todos select ids, then read each todo by key: what they return
/// must still be whole todos (dependencies included) in listing order, filtered as before.
#[test]
fn ready_claimed_and_gate_queries_return_whole_todos_in_listing_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
    let live_claim = |t: Todo, expires_at: i64| Todo {
        claim: t.claim.map(|c| Claim { expires_at, ..c }),
        ..t
    };
    let with_status = |t: Todo, status: TodoStatus| Todo { status, ..t };
    let gate = |id: &str, priority: Priority, status: TodoStatus| Todo {
        role: Role::User,
        kind: TodoKind::UserGate,
        status,
        ..todo(id, priority, None, false)
    };
    let created = [
        todo("a", Priority::P1, None, false),
        // Claimed, lease expired at 9,000: ready again.
        todo("b", Priority::P0, None, true),
        // Claimed, lease live at 10,000: a1's claim, not ready.
        live_claim(todo("c", Priority::P0, None, true), 20_000),
        // Depends on `a`, which is not completed: not ready.
        Todo {
            depends_on: vec!["a".into()],
            ..todo("d", Priority::P0, None, false)
        },
        // Depends only on completed `f`: ready.
        Todo {
            depends_on: vec!["f".into()],
            ..todo("e", Priority::P3, Some("cap.x"), false)
        },
        with_status(todo("f", Priority::P0, None, false), TodoStatus::Completed),
        gate("u2", Priority::P2, TodoStatus::Open),
        gate("u1", Priority::P1, TodoStatus::Open),
        gate("u3", Priority::P0, TodoStatus::Completed),
    ];
    {
        let tx = store.begin_write().unwrap();
        tx.insert_goal(&goal()).unwrap();
        for t in &created {
            tx.insert_todo(t).unwrap();
        }
        tx.commit().unwrap();
    }
    let original = |id: &str| created.iter().find(|c| c.id == id).unwrap().clone();
    let tx = store.begin_read().unwrap();
    let now = 10_000;
    assert_eq!(
        tx.ready_todos("g", now, 10).unwrap(),
        [original("b"), original("a"), original("e")]
    );
    assert_eq!(
        tx.ready_todos("g", now, 2).unwrap(),
        [original("b"), original("a")]
    );
    assert_eq!(tx.claimed_by("g", "a1", now).unwrap(), Some(original("c")));
    assert_eq!(tx.claimed_by("g", "a2", now).unwrap(), None);
    assert_eq!(
        tx.open_user_todos("g").unwrap(),
        [original("u1"), original("u2")]
    );
}

#[test]
fn sqlite_is_built_with_the_flags_of_cargo_config() {
    // Without DISABLE_DIRSYNC, every write command pays an extra directory fsync on its first
    // commit. It is one of the `LIBSQLITE3_FLAGS` in `.cargo/config.toml`, whose other
    // settings (`HAVE_FDATASYNC` among them) compile_options does not list: a build that
    // misses that file fails here.
    let conn = Connection::open_in_memory().unwrap();
    let options: Vec<String> = conn
        .prepare("PRAGMA compile_options")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert!(
        options.iter().any(|o| o == "DISABLE_DIRSYNC"),
        "SQLite built without SQLITE_DISABLE_DIRSYNC: {options:?}"
    );
    // The full-text and R-tree modules, which LoopX never uses, are left out: each
    // connection registered them, and FTS5 alone linked the math library into every process.
    for unused in [
        "ENABLE_FTS3",
        "ENABLE_FTS5",
        "ENABLE_RTREE",
        "ENABLE_DBSTAT_VTAB",
    ] {
        assert!(
            !options.iter().any(|o| o == unused),
            "SQLite built with SQLITE_{unused}: {options:?}"
        );
    }
}

/// Every connection the store opens plans without bound values, so no statement is prepared a
/// second time on its first step, and never checkpoints on close.
#[test]
fn the_store_connection_has_the_planner_guarantee_and_no_checkpoint_on_close() {
    use rusqlite::config::DbConfig;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loopx.db");
    let check = |store: &SqliteStore| {
        assert!(
            store
                .conn
                .db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG)
                .unwrap()
        );
        assert!(
            store
                .conn
                .db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE)
                .unwrap()
        );
    };
    let created = SqliteStore::create(&path).unwrap();
    check(&created);
    drop(created);
    check(&SqliteStore::open(&path, SchemaUpgrade::Apply).unwrap());
}

/// A new database at `path` whose one commit (goal `g`) is still in its WAL.
fn store_with_goal_in_its_wal(path: &Path) {
    let mut store = SqliteStore::create(path).unwrap();
    let tx = store.begin_write().unwrap();
    tx.insert_goal(&goal()).unwrap();
    tx.commit().unwrap();
}

#[test]
fn a_store_whose_wal_was_removed_reopens_with_its_data() {
    // Another SQLite client closing the database last checkpoints and deletes the WAL; the
    // next open creates it again (and syncs the directory, `sync_directory`).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loopx.db");
    store_with_goal_in_its_wal(&path);
    assert!(wal_path(&path).exists());
    let plain = Connection::open(&path).unwrap();
    plain
        .query_row("SELECT COUNT(*) FROM goals", [], |r| r.get::<_, i64>(0))
        .unwrap();
    plain.close().unwrap();
    assert!(!wal_path(&path).exists(), "a plain close removes the WAL");
    let mut store = SqliteStore::open(&path, SchemaUpgrade::Apply).unwrap();
    assert!(wal_path(&path).exists());
    let tx = store.begin_write().unwrap();
    assert_eq!(tx.goal("g").unwrap().map(|g| g.title), Some("G".into()));
    tx.insert_todo(&todo("t1", Priority::P1, None, false))
        .unwrap();
    tx.commit().unwrap();
}

/// SQLite reads a log with a damaged header as empty: the project would look as of its last
/// checkpoint, and the next commit would start the log over, discarding the rest. The store
/// reports it instead and leaves both files as they were.
#[test]
fn a_wal_with_a_damaged_header_is_reported_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loopx.db");
    store_with_goal_in_its_wal(&path);
    let wal = wal_path(&path);
    let (db_bytes, wal_bytes) = (std::fs::read(&path).unwrap(), std::fs::read(&wal).unwrap());
    type Damage = fn(&mut Vec<u8>);
    let damages: [(&str, Damage); 4] = [
        ("zeroed header", |w| w[..32].fill(0)),
        ("wrong magic", |w| w[3] ^= 0x40),
        ("salt changed under its checksum", |w| w[17] ^= 1),
        ("page size not a power of two", |w| w[10] ^= 0x03),
    ];
    for (what, damage) in damages {
        let mut damaged = wal_bytes.clone();
        damage(&mut damaged);
        std::fs::write(&path, &db_bytes).unwrap();
        std::fs::write(&wal, &damaged).unwrap();
        let err = SqliteStore::open(&path, SchemaUpgrade::Apply)
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(&err, LoopxError::Corrupt { path: p, .. } if *p == wal),
            "{what}: {err}"
        );
        assert!(
            err.to_string().contains("move loopx.db-wal aside"),
            "{what}: {err}"
        );
        assert_eq!(
            std::fs::read(&wal).unwrap(),
            damaged,
            "{what}: the log was changed"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            db_bytes,
            "{what}: the database was changed"
        );
    }
    // The same log undamaged opens, with the commit it holds.
    std::fs::write(&wal, &wal_bytes).unwrap();
    let store = SqliteStore::open(&path, SchemaUpgrade::Apply).unwrap();
    let tx = store.begin_read().unwrap();
    assert_eq!(tx.goal("g").unwrap().map(|g| g.title), Some("G".into()));
}

#[test]
fn the_wal_starts_over_in_place_across_fresh_connections() {
    // Every command is a new connection that rebuilds the WAL index from the file. The WAL
    // must still start over once past WAL_CHECKPOINT_FRAMES (bounded length) and must keep
    // its blocks when it does (never truncated to nothing).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loopx.db");
    drop(SqliteStore::create(&path).unwrap());
    let bound = (WAL_CHECKPOINT_FRAMES as u64 + 16) * (32 + 24 + 4096);
    let mut longest = 0;
    for i in 0..300 {
        let mut store = SqliteStore::open(&path, SchemaUpgrade::Apply).unwrap();
        let tx = store.begin_write().unwrap();
        tx.insert_goal(&Goal {
            id: format!("g{i}"),
            ..goal()
        })
        .unwrap();
        tx.commit().unwrap();
        let len = std::fs::metadata(wal_path(&path)).unwrap().len();
        assert!(
            len <= bound,
            "commit {i}: WAL of {len} bytes, bound {bound}"
        );
        assert!(
            len >= longest,
            "commit {i}: WAL cut from {longest} to {len} bytes"
        );
        longest = len;
    }
    assert!(longest > bound / 2, "the WAL never filled: {longest} bytes");
    let store = SqliteStore::open(&path, SchemaUpgrade::Apply).unwrap();
    assert!(store.integrity_check().unwrap().is_empty());
    let tx = store.begin_read().unwrap();
    assert_eq!(tx.goals().unwrap().len(), 300);
}

#[test]
fn gate_ids_are_read_from_the_role_index_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
    let plan: Vec<String> = store
        .conn
        .prepare(&format!("EXPLAIN QUERY PLAN {OPEN_USER_TODO_IDS}"))
        .unwrap()
        .query_map(["g"], |r| r.get::<_, String>(3))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert!(
        plan.iter().any(|step| step
            .contains("USING COVERING INDEX todos_by_role_status (goal_id=? AND role=?)")),
        "{plan:?}"
    );
}

#[test]
fn view_key_round_trips_every_role_status_and_order() {
    for &role in Role::ALL {
        for &status in TodoStatus::ALL {
            for (rank, seq) in [(0, 0), (4, 1), (2, 123_456), (15, (1 << 44) - 1)] {
                let lines = TodoLines {
                    order: TodoOrder::new(rank, seq),
                    role,
                    status,
                    json: "",
                    md: "",
                };
                let key = pack_view_key(&lines).expect("fits");
                assert_eq!(
                    unpack_view_key(key),
                    Some((lines.order, role, status)),
                    "{role:?} {status:?} {rank} {seq}"
                );
            }
        }
    }
    let too_far = TodoLines {
        order: TodoOrder::new(0, 1 << 44),
        role: Role::Agent,
        status: TodoStatus::Open,
        json: "",
        md: "",
    };
    assert_eq!(pack_view_key(&too_far), None);
    assert_eq!(unpack_view_key(-1), None);
    assert_eq!(unpack_view_key(15 << 52), None, "no 16th role");
}

fn visit(tx: &dyn StoreRead, format: i64) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    crate::kernel::store::for_each_projected_todo(tx, "g", format, &mut |t| {
        out.push(match t {
            ProjectedTodo::Cached(lines) => (lines.json.to_owned(), Some(lines.md.to_owned())),
            ProjectedTodo::Uncached(t, _) => (t.id.clone(), None),
        });
        Ok(())
    })
    .unwrap();
    out.sort();
    out
}

/// Lines are served only in the format they were cached in, never for a claimed todo, and
/// never after the todo is written again.
#[test]
fn cached_lines_are_served_only_while_valid() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
    let tx = store.begin_write().unwrap();
    tx.insert_goal(&goal()).unwrap();
    tx.insert_todo(&todo("t1", Priority::P1, None, false))
        .unwrap();
    tx.insert_todo(&todo("t2", Priority::P1, None, true))
        .unwrap();
    assert_eq!(
        visit(&*tx, 1),
        [("t1".to_owned(), None), ("t2".to_owned(), None)]
    );
    let lines = |json, md| TodoLines {
        order: TodoOrder::new(1, 1),
        role: Role::Agent,
        status: TodoStatus::Open,
        json,
        md,
    };
    tx.projection_cache_tx()
        .unwrap()
        .cache_projected_todo("g", "t1", 1, &lines("J1", "M1"))
        .unwrap();
    tx.projection_cache_tx()
        .unwrap()
        .cache_projected_todo("g", "t2", 1, &lines("J2", "M2"))
        .unwrap();
    assert_eq!(
        visit(&*tx, 1),
        [
            ("J1".to_owned(), Some("M1".to_owned())),
            ("t2".to_owned(), None)
        ],
        "t1 cached; t2 is claimed, so its lines depend on the time"
    );
    assert_eq!(
        visit(&*tx, 2),
        [("t1".to_owned(), None), ("t2".to_owned(), None)],
        "another format renders afresh"
    );
    let mut t1 = tx.todo("g", "t1").unwrap().unwrap();
    t1.title = "changed".into();
    tx.update_todo(&t1).unwrap();
    assert_eq!(
        visit(&*tx, 1),
        [("t1".to_owned(), None), ("t2".to_owned(), None)],
        "a write clears the lines"
    );
    tx.commit().unwrap();
}

/// The goal projections list every open todo but only the newest finished ones of each status,
/// however many the window holds: their cost does not grow with how fast a goal finishes work.
#[test]
fn the_live_window_lists_the_newest_finished_todos_up_to_its_cap() {
    use super::retention::LIVE_FINISHED_PER_STATUS;
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
    let finished = LIVE_FINISHED_PER_STATUS as usize + 50;
    {
        let tx = store.begin_write().unwrap();
        tx.insert_goal(&goal()).unwrap();
        tx.insert_todo(&todo("open", Priority::P2, None, false))
            .unwrap();
        for i in 0..finished {
            tx.insert_todo(&Todo {
                status: TodoStatus::Completed,
                updated_at: 1_000 + i as i64,
                ..todo(&format!("done{i}"), Priority::P2, None, false)
            })
            .unwrap();
        }
        tx.commit().unwrap();
    }
    let read = store.begin_read().unwrap();
    let tx = read.projection_cache().expect("SQLite caches projections");
    let mut listed = Vec::new();
    tx.for_each_live_projected_todo("g", 1, 0, &mut |t| {
        if let ProjectedTodo::Uncached(todo, _) = t {
            listed.push(todo.id.clone());
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(listed.len(), 1 + LIVE_FINISHED_PER_STATUS as usize);
    assert!(listed.contains(&"open".to_string()));
    assert!(
        listed.contains(&format!("done{}", finished - 1)),
        "the newest"
    );
    assert!(
        !listed.contains(&"done0".to_string()),
        "the oldest is counted, not listed"
    );
    // The window still bounds it: nothing finished before `finished_since` is listed.
    let mut recent = 0;
    tx.for_each_live_projected_todo("g", 1, 1_000 + finished as i64 - 10, &mut |_| {
        recent += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(recent, 1 + 10);
}

#[test]
fn the_next_lease_expiry_is_one_index_probe() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
    let plan: Vec<String> = store
        .conn
        .prepare(&format!(
            "EXPLAIN QUERY PLAN {}",
            super::monitors::NEXT_LEASE_EXPIRY
        ))
        .unwrap()
        .query_map(["g", "0"], |r| r.get::<_, String>(3))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert!(
        plan.iter().any(|step| step.contains(
            "USING COVERING INDEX todos_by_expiry (goal_id=? AND status=? AND claim_expires_at>?)"
        )),
        "{plan:?}"
    );
}

/// The queries behind the partial todo indexes (migration 15) still use them: each index's `WHERE`
/// is implied by the query's own terms, or SQLite would walk the goal's todos instead.
#[test]
fn the_partial_todo_indexes_serve_their_queries() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
    let plan = |sql: &str, params: &[&dyn rusqlite::ToSql]| -> Vec<String> {
        store
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap()
            .query_map(params, |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    };
    let cases: [(String, &[&dyn rusqlite::ToSql], &str); 4] = [
        (
            super::todos::CLAIM_OF_AGENT.to_string(),
            &[&"g", &"a", &0],
            "todos_by_expiry",
        ),
        (
            super::todos::bound_capabilities_sql(),
            &[&"g"],
            "todos_by_capability",
        ),
        (
            super::retention::finished_between_sql(),
            &[&"g", &0, &1],
            "todos_by_finish",
        ),
        (
            super::monitors::NEXT_LEASE_EXPIRY.to_string(),
            &[&"g", &0],
            "todos_by_expiry",
        ),
    ];
    for (sql, params, index) in cases {
        let steps = plan(&sql, params);
        assert!(
            steps
                .iter()
                .any(|step| step.contains(&format!("INDEX {index} "))),
            "{sql}: {steps:?}"
        );
    }
}

/// Rendering a goal reads its live todos' cached lines from one covering index (no row looked up
/// by key), and its recently finished ones from `todos_by_finish`.
#[test]
fn the_projections_live_todos_come_from_one_covering_index() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
    let mut plan: Vec<String> = Vec::new();
    for (i, sql) in super::retention::live_projected_todos_sql()
        .iter()
        .enumerate()
    {
        let mut stmt = store
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap();
        let detail = |r: &rusqlite::Row<'_>| r.get::<_, String>(3);
        if i == 0 {
            let steps = stmt.query_map(rusqlite::params!["g", 1], detail).unwrap();
            plan.extend(steps.map(Result::unwrap));
        } else {
            let steps = stmt
                .query_map(rusqlite::params!["g", 1, 0, 100], detail)
                .unwrap();
            plan.extend(steps.map(Result::unwrap));
        }
    }
    assert!(
        plan.iter().any(|step| step
            == "SEARCH todos USING COVERING INDEX todos_live_views (goal_id=? AND status=?)"),
        "{plan:?}"
    );
    assert_eq!(
        plan.iter()
            .filter(|step| step.contains("todos_by_finish"))
            .count(),
        2,
        "{plan:?}"
    );
}

#[test]
fn a_new_todos_seq_is_one_index_probe() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
    let plan: Vec<String> = store
        .conn
        .prepare(&format!(
            "EXPLAIN QUERY PLAN {}",
            super::todos::NEXT_TODO_SEQ
        ))
        .unwrap()
        .query_map(["g"], |r| r.get::<_, String>(3))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(
        plan,
        ["SEARCH todos USING COVERING INDEX todos_by_seq (goal_id=?)"],
        "{plan:?}"
    );
}

/// The live statuses and the finished ones are every status, once.
#[test]
fn live_and_terminal_statuses_partition_the_statuses() {
    let live = super::todos::LIVE_STATUSES;
    for status in TodoStatus::ALL {
        let quoted = format!("'{status}'");
        assert_ne!(
            live.contains(&quoted),
            status.is_terminal(),
            "{status} must be in exactly one of the live statuses and the terminal ones"
        );
    }
}

/// A new database file at `path` with the migrations up to `version` applied, as a binary of that
/// schema version left it.
fn database_at_version(path: &Path, version: i64) -> Connection {
    let conn = Connection::open(path).unwrap();
    for (v, sql) in MIGRATIONS.iter().filter(|m| m.0 <= version) {
        conn.execute_batch(sql).unwrap();
        conn.pragma_update(None, "user_version", v).unwrap();
    }
    conn
}

/// Migration 16 folds the monitor, goal-probe and retention-policy columns into one JSON object
/// each and the commit counter into `store_meta`: a database at version 15 reads back every
/// field of every row after the upgrade, set or unset.
#[test]
fn migration_16_keeps_every_field_of_monitors_probes_the_policy_and_the_counter() {
    use crate::kernel::store::RetentionPolicy;
    use crate::model::{CheckResult, GoalProbe, Monitor, MonitorFollowUp, ProbeSpec};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loopx.db");
    {
        let conn = database_at_version(&path, 15);
        conn.execute_batch(
            "INSERT INTO monitors (goal_id, todo_id, every_ms, until_at, target, follow_up, \
             max_no_change, probe, next_due_at, last_check_at, last_digest, last_result, \
             no_change_count, material_change, checks, failures, last_failure, check_seq, \
             checked_fence, created_at, updated_at) VALUES \
             ('g', 'full', 60000, 900000, 'metric:x', 'replan', 4, \
              '{\"provider\":\"ext/p\",\"operation\":\"read\",\"target\":\"a b\"}', 120000, \
              110000, 'sha256:1', 'changed', 2, 1, 7, 3, 'timed out', 9, 5, 1000, 2000), \
             ('g', 'bare', 1000, NULL, NULL, 'none', 0, NULL, 5, NULL, NULL, NULL, 0, 0, 0, \
              0, NULL, 0, 0, 1, 1);
             INSERT INTO goal_probes (goal_id, provider, operation, target, revision, \
             ran_revision, run_seq, runs, failures, last_result, last_digest, last_checked_at, \
             last_failure, last_observation, changed_at, created_at, updated_at) VALUES \
             ('g', 'ext/p', 'read', 'https://x', 3, 2, 8, 6, 1, 'unchanged', 'sha256:2', 700, \
              'trap', 'seen \"quoted\"', 650, 10, 20), \
             ('h', 'ext/q', 'op', 't', 1, 0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1);
             INSERT INTO retention_policy (id, live_window_days, journal_full_days, \
             keep_journal_bodies, report_files_days, history_days, updated_at) \
             VALUES (1, 3, 10, 1, 14, 90, 5);
             UPDATE commits SET seq = 41 WHERE id = 1;",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path, SchemaUpgrade::Apply).unwrap();
    assert_eq!(store.current_version().unwrap(), 16);
    assert!(store.integrity_check().unwrap().is_empty());
    let tx = store.begin_read().unwrap();
    let full = Monitor {
        goal_id: "g".into(),
        todo_id: "full".into(),
        every_ms: 60_000,
        until_at: Some(900_000),
        target: Some("metric:x".into()),
        follow_up: MonitorFollowUp::Replan,
        max_no_change: 4,
        probe: Some(ProbeSpec {
            provider: "ext/p".into(),
            operation: "read".into(),
            target: "a b".into(),
        }),
        next_due_at: 120_000,
        last_check_at: Some(110_000),
        last_digest: Some("sha256:1".into()),
        last_result: Some(CheckResult::Changed),
        no_change_count: 2,
        material_change: true,
        checks: 7,
        failures: 3,
        last_failure: Some("timed out".into()),
        check_seq: 9,
        checked_fence: 5,
        created_at: 1_000,
        updated_at: 2_000,
    };
    let bare = Monitor {
        goal_id: "g".into(),
        todo_id: "bare".into(),
        every_ms: 1_000,
        until_at: None,
        target: None,
        follow_up: MonitorFollowUp::None,
        max_no_change: 0,
        probe: None,
        next_due_at: 5,
        last_check_at: None,
        last_digest: None,
        last_result: None,
        no_change_count: 0,
        material_change: false,
        checks: 0,
        failures: 0,
        last_failure: None,
        check_seq: 0,
        checked_fence: 0,
        created_at: 1,
        updated_at: 1,
    };
    assert_eq!(tx.monitors("g").unwrap(), vec![bare, full]);
    assert_eq!(
        tx.goal_probe("g").unwrap(),
        Some(GoalProbe {
            goal_id: "g".into(),
            spec: ProbeSpec {
                provider: "ext/p".into(),
                operation: "read".into(),
                target: "https://x".into(),
            },
            revision: 3,
            ran_revision: 2,
            run_seq: 8,
            runs: 6,
            failures: 1,
            last_result: Some(CheckResult::Unchanged),
            last_digest: Some("sha256:2".into()),
            last_checked_at: Some(700),
            last_failure: Some("trap".into()),
            last_observation: Some("seen \"quoted\"".into()),
            changed_at: Some(650),
            created_at: 10,
            updated_at: 20,
        })
    );
    let h = tx.goal_probe("h").unwrap().unwrap();
    assert_eq!((h.revision, h.last_result, h.changed_at), (1, None, None));
    assert_eq!(
        tx.retention().retention_policy().unwrap(),
        Some(RetentionPolicy {
            live_window_days: 3,
            journal_full_days: 10,
            keep_journal_bodies: true,
            report_files_days: 14,
            history_days: 90,
        })
    );
    assert_eq!(tx.commit_seq().unwrap(), CommitSeq(41));
    drop(tx);
    let objects: Vec<String> = store
        .conn
        .prepare("SELECT name FROM sqlite_schema WHERE name IN ('commits', 'retention_policy', 'monitors_v16', 'goal_probes_v16')")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert!(objects.is_empty(), "left behind: {objects:?}");
}

/// A database at version 15 whose stored monitor probe is not JSON is not migrated: the upgrade
/// stops, names the migration, and leaves the file at version 15 for the operator to repair.
#[test]
fn migration_16_refuses_a_monitor_probe_that_is_not_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loopx.db");
    {
        let conn = database_at_version(&path, 15);
        conn.execute_batch(
            "INSERT INTO monitors (goal_id, todo_id, every_ms, follow_up, max_no_change, probe, \
             next_due_at, created_at, updated_at) VALUES ('g', 'm', 1000, 'none', 3, '{broken', \
             5, 1, 1);",
        )
        .unwrap();
    }
    let err = SqliteStore::open(&path, SchemaUpgrade::Apply)
        .err()
        .expect("the migration must fail");
    assert!(err.to_string().contains("migration 16"), "{err}");
    let conn = Connection::open(&path).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 15);
    let probe: String = conn
        .query_row("SELECT probe FROM monitors", [], |r| r.get(0))
        .unwrap();
    assert_eq!(probe, "{broken");
}
