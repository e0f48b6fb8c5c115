//! Quota policy and the spend/void ledger, keyed by effect id so a retried spend counts once.

use super::*;

impl Db<'_> {
    pub(super) fn quota_policy(&self, goal_id: &str) -> Result<Option<QuotaPolicy>> {
        self.query_opt(
            "SELECT compute, window_hours, slot_minutes, allowed_slots, per_agent_cap FROM quota_policy WHERE goal_id = ?1",
            [goal_id],
            |r| {
                Ok(QuotaPolicy {
                    compute: r.get(0)?,
                    window_hours: r.get(1)?,
                    slot_minutes: r.get(2)?,
                    allowed_slots: r.get(3)?,
                    per_agent_cap: r.get(4)?,
                })
            },
            "reading quota policy",
        )
    }

    pub(super) fn set_quota_policy(&self, goal_id: &str, p: &QuotaPolicy) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO quota_policy (goal_id, compute, window_hours, slot_minutes, allowed_slots, per_agent_cap) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(goal_id) DO UPDATE SET compute = excluded.compute, \
                 window_hours = excluded.window_hours, slot_minutes = excluded.slot_minutes, \
                 allowed_slots = excluded.allowed_slots, per_agent_cap = excluded.per_agent_cap",
                params![goal_id, p.compute, p.window_hours, p.slot_minutes, p.allowed_slots, p.per_agent_cap],
            )
            .map_err(self.err("writing quota policy"))?;
        Ok(())
    }

    pub(super) fn ledger_entry(&self, effect_id: &str) -> Result<Option<LedgerEntry>> {
        self.query_opt(
            &format!("SELECT {LEDGER_COLUMNS} FROM quota_ledger WHERE effect_id = ?1"),
            [effect_id],
            ledger_from_row,
            "reading the ledger",
        )
    }

    pub(super) fn insert_ledger(&self, e: &LedgerEntry) -> Result<bool> {
        let n = self
            .conn
            .prepare_cached(&format!(
                "INSERT OR IGNORE INTO quota_ledger ({LEDGER_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    e.effect_id,
                    e.goal_id,
                    e.agent_id,
                    e.run_id,
                    e.slots,
                    e.kind.as_str(),
                    e.voids_effect_id,
                    e.created_at
                ])
            })
            .map_err(self.err("writing the ledger"))?;
        if n == 1 {
            self.add_to_windows(e)?;
        }
        Ok(n == 1)
    }

    /// Counts a new ledger row in its goal's and its agent's window aggregate (see V6 in
    /// `migrations.rs`): a row dated at or after the aggregate's `since` is inside what it sums.
    fn add_to_windows(&self, e: &LedgerEntry) -> Result<()> {
        for key in window_keys(e.agent_id.as_deref()) {
            self.conn
                .prepare_cached(
                    "INSERT INTO quota_window (goal_id, agent_key, live_slots, since) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT(goal_id, agent_key) DO UPDATE SET live_slots = live_slots + \
                     CASE WHEN ?4 >= since THEN ?3 ELSE 0 END",
                )
                .and_then(|mut s| s.execute(params![e.goal_id, key, e.slots, e.created_at]))
                .map_err(self.err("counting the ledger's window"))?;
        }
        Ok(())
    }

    /// The window aggregate of a goal (`agent_key` ''), or of one agent: `(live_slots, since)`.
    fn window(&self, goal_id: &str, agent_key: &str) -> Result<Option<(i64, i64)>> {
        self.query_opt(
            "SELECT live_slots, since FROM quota_window WHERE goal_id = ?1 AND agent_key = ?2",
            params![goal_id, agent_key],
            |r| Ok((r.get(0)?, r.get(1)?)),
            "reading the ledger's window",
        )
    }

    /// Net slots of the ledger rows dated in `[from, to)`, of the goal or of one agent: the rows
    /// between an aggregate's `since` and the one asked for, few because every spend moves the
    /// aggregate up to its window's start.
    fn ledger_between(&self, goal_id: &str, agent_key: &str, from: i64, to: i64) -> Result<i64> {
        if agent_key.is_empty() {
            self.query_one(
                "SELECT COALESCE(SUM(slots), 0) FROM quota_ledger \
                 WHERE goal_id = ?1 AND created_at >= ?2 AND created_at < ?3",
                params![goal_id, from, to],
                |r| r.get(0),
                "summing the ledger",
            )
        } else {
            self.query_one(
                "SELECT COALESCE(SUM(slots), 0) FROM quota_ledger \
                 WHERE goal_id = ?1 AND agent_id = ?2 AND created_at >= ?3 AND created_at < ?4",
                params![goal_id, agent_key, from, to],
                |r| r.get(0),
                "summing the ledger",
            )
        }
    }

    /// Net slots at or after `at`, from the aggregate kept at `since`: the rows between the two
    /// are added or taken off.
    fn live_at(&self, goal_id: &str, agent_key: &str, at: i64) -> Result<i64> {
        let Some((live, since)) = self.window(goal_id, agent_key)? else {
            return Ok(0);
        };
        Ok(if at >= since {
            live - self.ledger_between(goal_id, agent_key, since, at)?
        } else {
            live + self.ledger_between(goal_id, agent_key, at, since)?
        })
    }

    pub(super) fn move_quota_window(
        &self,
        goal_id: &str,
        agent_id: Option<&str>,
        since: i64,
    ) -> Result<()> {
        for key in window_keys(agent_id) {
            if self.window(goal_id, key)?.is_none_or(|(_, at)| at == since) {
                continue;
            }
            let live = self.live_at(goal_id, key, since)?;
            self.conn
                .prepare_cached(
                    "UPDATE quota_window SET live_slots = ?3, since = ?4 WHERE goal_id = ?1 AND agent_key = ?2",
                )
                .and_then(|mut s| s.execute(params![goal_id, key, live, since]))
                .map_err(self.err("moving the ledger's window"))?;
        }
        Ok(())
    }

    pub(super) fn spent_since(
        &self,
        goal_id: &str,
        since: i64,
        agent_id: Option<&str>,
    ) -> Result<i64> {
        self.live_at(goal_id, agent_id.unwrap_or(""), since)
    }

    /// [`Db::spent_since`] the way it was before the window aggregate: every row of the window
    /// summed. What the aggregate is checked against.
    #[cfg(test)]
    pub(super) fn spent_since_by_scan(
        &self,
        goal_id: &str,
        since: i64,
        agent_id: Option<&str>,
    ) -> Result<i64> {
        self.query_one(
            "SELECT COALESCE(SUM(slots), 0) FROM quota_ledger WHERE goal_id = ?1 AND created_at >= ?2 \
             AND (?3 IS NULL OR agent_id = ?3)",
            params![goal_id, since, agent_id],
            |r| r.get(0),
            "summing the ledger",
        )
    }

    pub(super) fn oldest_spend_since(&self, goal_id: &str, since: i64) -> Result<Option<i64>> {
        self.query_one(
            "SELECT MIN(created_at) FROM quota_ledger WHERE goal_id = ?1 AND created_at >= ?2 AND kind = 'spend'",
            params![goal_id, since],
            |r| r.get(0),
            "reading the ledger",
        )
    }

    pub(super) fn recent_ledger(&self, goal_id: &str, limit: usize) -> Result<Vec<LedgerEntry>> {
        self.query_all(
            &format!(
                "SELECT {LEDGER_COLUMNS} FROM quota_ledger WHERE goal_id = ?1 ORDER BY created_at DESC, effect_id LIMIT ?2"
            ),
            params![goal_id, limit as i64],
            ledger_from_row,
            "reading the ledger",
        )
    }

    /// One index range over `ledger_by_time` (goal, time, kind, slots: covering), each row added
    /// to its bucket as it is stepped: no sort and no row outside `[from, to)` is read.
    pub(super) fn spend_series(
        &self,
        goal_id: &str,
        from: i64,
        to: i64,
        buckets: usize,
    ) -> Result<Vec<i64>> {
        if to <= from || buckets == 0 {
            return Ok(Vec::new());
        }
        let mut series = vec![0_i64; buckets];
        let span = i128::from(to) - i128::from(from);
        let n = buckets as i128;
        self.conn
            .prepare_cached(SPEND_SERIES_SQL)
            .and_then(|mut stmt| {
                let mut rows = stmt.query(params![goal_id, from, to])?;
                while let Some(row) = rows.next()? {
                    let at: i64 = row.get(0)?;
                    let slots: i64 = row.get(1)?;
                    let bucket = ((i128::from(at) - i128::from(from)) * n / span).clamp(0, n - 1);
                    series[bucket as usize] += slots;
                }
                Ok(())
            })
            .map_err(self.err("reading the ledger's spend over the window"))?;
        Ok(series)
    }
}

/// The rows [`Db::spend_series`] reads: the goal's ledger inside the window, from the index.
const SPEND_SERIES_SQL: &str = "SELECT created_at, slots FROM quota_ledger \
     WHERE goal_id = ?1 AND created_at >= ?2 AND created_at < ?3";

/// The window aggregates a ledger row counts in: its goal's (key '', which no agent id can be)
/// and, when it has one, its agent's.
fn window_keys(agent_id: Option<&str>) -> impl Iterator<Item = &str> {
    std::iter::once("").chain(agent_id)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::kernel::store::Store;

    fn store() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
        let tx = store.begin_write().unwrap();
        tx.insert_goal(&super::super::tests::goal()).unwrap();
        tx.commit().unwrap();
        (dir, store)
    }

    fn spend(id: &str, agent: Option<&str>, slots: i64, at: i64) -> LedgerEntry {
        LedgerEntry {
            effect_id: id.into(),
            goal_id: "g".into(),
            agent_id: agent.map(str::to_owned),
            run_id: None,
            slots,
            kind: LedgerKind::Spend,
            voids_effect_id: None,
            created_at: at,
        }
    }

    /// One write of the ledger: a spend, a void of the n-th spend so far, or a window move.
    #[derive(Debug, Clone)]
    enum Op {
        Spend {
            agent: Option<u8>,
            slots: i64,
            at: i64,
        },
        Void(usize),
        Move {
            agent: Option<u8>,
            since: i64,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        let agent = proptest::option::of(0u8..3);
        prop_oneof![
            4 => (agent.clone(), 1i64..4, 0i64..2_000)
                .prop_map(|(agent, slots, at)| Op::Spend { agent, slots, at }),
            1 => (0usize..64).prop_map(Op::Void),
            2 => (agent, 0i64..2_200).prop_map(|(agent, since)| Op::Move { agent, since }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// The aggregate answers exactly what summing the window's rows answers, for the goal and
        /// every agent, at every start, after any mix of spends, voids (dated at their spend) and
        /// window moves in both directions.
        #[test]
        fn the_window_aggregate_equals_the_scan(ops in proptest::collection::vec(op(), 1..60)) {
            let (_dir, mut store) = store();
            let agents = ["a0", "a1", "a2"];
            let mut spends: Vec<LedgerEntry> = Vec::new();
            let tx = store.begin_write().unwrap();
            for (i, op) in ops.iter().enumerate() {
                match op {
                    Op::Spend { agent, slots, at } => {
                        let e = spend(&format!("e{i}"), agent.map(|a| agents[a as usize]), *slots, *at);
                        prop_assert!(tx.insert_ledger(&e).unwrap());
                        spends.push(e);
                    }
                    Op::Void(n) if !spends.is_empty() => {
                        let s = &spends[n % spends.len()];
                        let void = LedgerEntry {
                            effect_id: format!("void:{}", s.effect_id),
                            slots: -s.slots,
                            kind: LedgerKind::Void,
                            voids_effect_id: Some(s.effect_id.clone()),
                            ..s.clone()
                        };
                        tx.insert_ledger(&void).unwrap();
                    }
                    Op::Void(_) => {}
                    Op::Move { agent, since } => tx
                        .move_quota_window("g", agent.map(|a| agents[a as usize]), *since)
                        .unwrap(),
                }
            }
            tx.commit().unwrap();
            let db = Db::new(&store.conn, &store.path);
            for since in (0..2_100).step_by(37).chain([0, 999, 1_000, 1_999, 2_000]) {
                for agent in [None, Some("a0"), Some("a1"), Some("a2"), Some("none")] {
                    prop_assert_eq!(
                        db.spent_since("g", since, agent).unwrap(),
                        db.spent_since_by_scan("g", since, agent).unwrap(),
                        "since {} agent {:?}", since, agent
                    );
                }
            }
        }
    }

    /// Checking the quota reads the aggregate, not the window's rows: with the window moved to
    /// its start, rows inside it removed behind the store's back are still counted (a scan would
    /// count 0), while the rows between the aggregate's start and a later one are read.
    #[test]
    fn a_read_at_the_aggregates_start_reads_no_ledger_row() {
        let (_dir, mut store) = store();
        let tx = store.begin_write().unwrap();
        for i in 0..500 {
            tx.insert_ledger(&spend(&format!("e{i}"), Some("a"), 1, 1_000 + i))
                .unwrap();
        }
        tx.move_quota_window("g", Some("a"), 1_100).unwrap();
        tx.commit().unwrap();
        let db = Db::new(&store.conn, &store.path);
        assert_eq!(db.spent_since("g", 1_100, None).unwrap(), 400);
        store
            .conn
            .execute("DELETE FROM quota_ledger WHERE created_at >= 1200", [])
            .unwrap();
        let db = Db::new(&store.conn, &store.path);
        assert_eq!(db.spent_since("g", 1_100, None).unwrap(), 400);
        assert_eq!(db.spent_since("g", 1_100, Some("a")).unwrap(), 400);
        assert_eq!(db.spent_since_by_scan("g", 1_100, None).unwrap(), 100);
        assert_eq!(db.spent_since("g", 1_150, None).unwrap(), 350);
    }

    /// The rows between an aggregate's start and the one asked for are found by an index range,
    /// never by walking the goal's ledger.
    #[test]
    fn the_rows_between_two_starts_are_an_index_range() {
        let (_dir, store) = store();
        for sql in [
            "SELECT COALESCE(SUM(slots), 0) FROM quota_ledger \
             WHERE goal_id = 'g' AND created_at >= 1 AND created_at < 2",
            "SELECT COALESCE(SUM(slots), 0) FROM quota_ledger \
             WHERE goal_id = 'g' AND agent_id = 'a' AND created_at >= 1 AND created_at < 2",
        ] {
            let plan: Vec<String> = store
                .conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap()
                .query_map([], |r| r.get::<_, String>(3))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            assert!(
                plan.iter().any(|p| p.starts_with("SEARCH")
                    && p.contains("COVERING INDEX")
                    && p.contains("created_at>? AND created_at<?")),
                "{sql}: {plan:?}"
            );
        }
    }

    /// The spend series reads one range of the covering time index and nothing else (no scan
    /// of the goal's ledger, no table row, no sort), even with 100,000 older rows in the goal
    /// and the planner's statistics gathered over them: its cost follows the window's rows.
    #[test]
    fn the_spend_series_is_one_covering_index_range() {
        let (_dir, mut store) = store();
        let tx = store.begin_write().unwrap();
        for i in 0..100_000 {
            tx.insert_ledger(&spend(&format!("old{i}"), Some("a"), 1, i))
                .unwrap();
        }
        for i in 0..10 {
            tx.insert_ledger(&spend(&format!("new{i}"), None, 2, 200_000 + i * 100))
                .unwrap();
        }
        tx.commit().unwrap();
        store.conn.execute_batch("ANALYZE").unwrap();
        let plan: Vec<String> = store
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {SPEND_SERIES_SQL}"))
            .unwrap()
            .query_map(params!["g", 200_000, 201_000], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(
            plan,
            ["SEARCH quota_ledger USING COVERING INDEX ledger_by_time \
                 (goal_id=? AND created_at>? AND created_at<?)"],
            "{plan:?}"
        );
        let db = Db::new(&store.conn, &store.path);
        assert_eq!(
            db.spend_series("g", 200_000, 201_000, 5).unwrap(),
            [4, 4, 4, 4, 4]
        );
    }
}
