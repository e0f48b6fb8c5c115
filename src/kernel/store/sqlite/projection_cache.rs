//! The projection cache: each todo's rendered `state.json` and `STATE.md` lines kept in its row
//! (`view_*` columns), so `refresh-state` copies the lines of unchanged todos instead of decoding
//! and rendering every todo. Cleared by every write of the todo.

use super::*;

/// The valid cached lines of a `for_each_projected_todo` row (`view_key, view_json, view_md, id,
/// valid`), or `None` when the todo must be rendered.
pub(super) fn cached_lines<'r>(row: &'r Row<'_>) -> rusqlite::Result<Option<TodoLines<'r>>> {
    if !row.get::<_, bool>(4)? {
        return Ok(None);
    }
    let (ValueRef::Integer(key), ValueRef::Text(json), ValueRef::Text(md)) =
        (row.get_ref(0)?, row.get_ref(1)?, row.get_ref(2)?)
    else {
        return Ok(None);
    };
    let Some((order, role, status)) = unpack_view_key(key) else {
        return Ok(None);
    };
    // Cached lines are derived data: lines that are not UTF-8 (a damaged page, a stray write) are
    // no reason to fail the command; the todo is rendered from its row instead, and the next
    // refresh caches fresh lines over them.
    let (Ok(json), Ok(md)) = (std::str::from_utf8(json), std::str::from_utf8(md)) else {
        return Ok(None);
    };
    Ok(Some(TodoLines {
        order,
        role,
        status,
        json,
        md,
    }))
}

/// Bits of `view_key` holding the todo's creation sequence; above them the priority rank (4 bits),
/// the status and the role (4 bits each, their position in `ALL`).
pub(super) const VIEW_KEY_SEQ_BITS: u32 = 44;

/// Packs a cached todo's order, role and status into the `view_key` column; `None` when a value
/// does not fit (the todo is then simply not cached).
pub(super) fn pack_view_key(lines: &TodoLines<'_>) -> Option<i64> {
    let TodoOrder { priority_rank, seq } = lines.order;
    let fits = (0..1i64 << VIEW_KEY_SEQ_BITS).contains(&seq) && (0..16).contains(&priority_rank);
    fits.then_some(
        (lines.role as i64) << (VIEW_KEY_SEQ_BITS + 8)
            | (lines.status as i64) << (VIEW_KEY_SEQ_BITS + 4)
            | priority_rank << VIEW_KEY_SEQ_BITS
            | seq,
    )
}

/// The inverse of [`pack_view_key`]; `None` for a key it could not have written.
pub(super) fn unpack_view_key(key: i64) -> Option<(TodoOrder, Role, TodoStatus)> {
    let field = |shift: u32| ((key >> shift) & 0xf) as usize;
    let role = *Role::ALL.get(field(VIEW_KEY_SEQ_BITS + 8))?;
    let status = *TodoStatus::ALL.get(field(VIEW_KEY_SEQ_BITS + 4))?;
    if key >> (VIEW_KEY_SEQ_BITS + 12) != 0 {
        return None;
    }
    let order = TodoOrder::new(
        field(VIEW_KEY_SEQ_BITS) as i64,
        key & ((1 << VIEW_KEY_SEQ_BITS) - 1),
    );
    Some((order, role, status))
}

impl Db<'_> {
    pub(super) fn for_each_projected_todo(
        &self,
        goal_id: &str,
        format: i64,
        visit: &mut dyn FnMut(ProjectedTodo<'_>) -> Result<()>,
    ) -> Result<()> {
        // One scan over the cached lines and their packed keys; the todos without valid lines (in
        // a tick, the one just completed and the claimed ones) are then read in full by key. A
        // second scan filtered on the cache columns would walk every row again to find those few.
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT view_key, view_json, view_md, id, view_format IS ?2 AND claim_agent IS NULL \
                 FROM todos WHERE goal_id = ?1",
            )
            .map_err(self.err("listing projected todos"))?;
        let mut rows = stmt
            .query(params![goal_id, format])
            .map_err(self.err("listing projected todos"))?;
        let mut uncached: Vec<String> = Vec::new();
        while let Some(row) = rows.next().map_err(self.err("listing projected todos"))? {
            match cached_lines(row).map_err(self.err("listing projected todos"))? {
                Some(lines) => visit(ProjectedTodo::Cached(lines))?,
                None => uncached.push(row.get(3).map_err(self.err("listing projected todos"))?),
            }
        }
        if uncached.is_empty() {
            return Ok(());
        }
        self.visit_todos(
            " AND id IN (SELECT value FROM json_each(?2))",
            params![goal_id, to_json(&uncached)],
            super::todos::DepsLookup::PerTodo,
            &mut |todo, order| visit(ProjectedTodo::Uncached(todo, order)),
        )
    }

    pub(super) fn cache_projected_todo(
        &self,
        goal_id: &str,
        todo_id: &str,
        format: i64,
        lines: &TodoLines<'_>,
    ) -> Result<()> {
        let Some(key) = pack_view_key(lines) else {
            return Ok(()); // out of the packed range: rendered afresh each time instead
        };
        self.conn
            .prepare_cached(
                "UPDATE todos SET view_format = ?3, view_json = ?4, view_md = ?5, view_key = ?6 \
                 WHERE goal_id = ?1 AND id = ?2",
            )
            .and_then(|mut s| {
                s.execute(params![goal_id, todo_id, format, lines.json, lines.md, key])
            })
            .map_err(self.err("caching projection lines"))?;
        Ok(())
    }
}
