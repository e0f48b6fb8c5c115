//! `loopx start-goal --goal-text T [--project DIR]`: one step from nothing to a goal.
//! `loopx start-goal --guided` asks for the title, objective and first todos on a terminal.

use serde_json::json;

use super::Context;
use super::goal::goal_output;
use super::output::Output;
use crate::error::Result;
use crate::kernel::Kernel;
use crate::kernel::goal::NewGoal;
use crate::kernel::projection::todo_json;
use crate::kernel::todo::NewTodo;
use crate::paths::ProjectPaths;

#[derive(Debug, clap::Args)]
pub struct StartGoalArgs {
    /// What the goal should achieve, in prose.
    #[arg(long, required_unless_present = "guided", conflicts_with = "guided")]
    pub goal_text: Option<String>,
    /// Ask for the goal's title, objective and first todos (stdin must be a terminal).
    #[arg(long)]
    pub guided: bool,
    /// Project directory (initialized if it has no `.loopx/`; default: the working directory).
    #[arg(long, value_parser = super::flags::path)]
    pub project: Option<std::path::PathBuf>,
}

/// What `--guided` asked for.
struct Answers {
    title: String,
    objective: String,
    todos: Vec<String>,
}

/// Asks on the terminal (questions on stderr, so stdout keeps the command's output). Everything
/// is asked before anything is written: an interrupted session leaves no half-made goal.
fn ask() -> Result<Answers> {
    use std::io::{BufRead, IsTerminal, Write};
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(crate::error::bad_input(
            "--guided asks its questions on a terminal, and stdin is not one: run it in a \
             terminal, or give the goal with --goal-text \"...\" (then add todos with `loopx todo add`)",
        ));
    }
    let mut lines = stdin.lock().lines();
    let mut prompt = |question: &str| -> Result<Option<String>> {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "{question}");
        let _ = err.flush();
        match lines.next() {
            None => Ok(None),
            Some(line) => line
                .map(|l| Some(l.trim().to_string()))
                .map_err(|e| crate::error::LoopxError::internal("reading the terminal", e)),
        }
    };
    let cancelled =
        || crate::error::bad_input("start-goal --guided cancelled: nothing was created");
    let title = loop {
        match prompt("Goal title (one line): ")? {
            None => return Err(cancelled()),
            Some(t) if t.is_empty() => continue,
            Some(t) => break t,
        }
    };
    let objective =
        prompt("What does success look like? (empty: the title) ")?.ok_or_else(cancelled)?;
    let mut todos = Vec::new();
    loop {
        let question = format!("First todo #{} (empty line to finish): ", todos.len() + 1);
        match prompt(&question)? {
            None => return Err(cancelled()),
            Some(t) if t.is_empty() => break,
            Some(t) => todos.push(t),
        }
    }
    Ok(Answers {
        objective: if objective.is_empty() {
            title.clone()
        } else {
            objective
        },
        title,
        todos,
    })
}

pub fn run(ctx: &Context, args: StartGoalArgs) -> Result<Output> {
    let answers = if args.guided { Some(ask()?) } else { None };
    let text = match &answers {
        Some(a) => a.objective.clone(),
        None => args.goal_text.unwrap_or_default().trim().to_string(),
    };
    if text.is_empty() {
        return Err(crate::error::bad_input(
            "--goal-text is empty; say what the goal should achieve",
        ));
    }
    let project = match args.project.or_else(|| ctx.root.clone()) {
        Some(p) => ctx.absolute(&p)?,
        None => ctx.cwd()?.to_path_buf(),
    };
    let title: String = match &answers {
        Some(a) => a.title.clone(),
        None => text
            .lines()
            .next()
            .unwrap_or(&text)
            .chars()
            .take(120)
            .collect(),
    };
    let new = NewGoal {
        title,
        objective: Some(text),
        project_dir: Some(project.display().to_string()),
        ..Default::default()
    };
    let first_todos: Vec<NewTodo> = answers
        .iter()
        .flat_map(|a| &a.todos)
        .map(NewTodo::task)
        .collect();
    // Refused input leaves the directory as it was: no project initialized for a goal that is
    // then not created.
    Kernel::check_new_goal(&new, &first_todos)?;
    // `start-goal` initializes a directory that has no project; a `.loopx/` whose database is
    // gone is a lost project, which only an explicit `loopx init` may replace.
    let paths = ProjectPaths::at(&project);
    if !paths.db().is_file() {
        paths.refuse_lost_database()?;
    }
    let initialized = Kernel::init(&project)?.is_some();
    let mut kernel = Kernel::open(ProjectPaths::at(&project))?;
    let actor = ctx.operator_or_agent();
    let (goal, added) = kernel.create_goal_with_todos(&actor, new, first_todos)?;
    let g = &goal.id;
    let next = vec![
        format!("loopx todo add --goal-id {g} --title \"[P1] first bounded step\""),
        format!("loopx --format json quota should-run --goal-id {g}"),
        format!("loopx status --goal-id {g}"),
    ];
    let mut out = goal_output(&goal, "Started goal");
    out.value["initialized_project"] = json!(initialized);
    out.value["next_cli_actions"] = json!(next);
    if !added.is_empty() {
        let now = crate::clock::now_ms();
        out.value["todos"] = json!(added.iter().map(|t| todo_json(t, now)).collect::<Vec<_>>());
        let rows = added
            .iter()
            .map(|t| vec![t.id.clone(), t.priority.to_string(), t.title.clone()])
            .collect();
        out = out.heading("Todos").table(&["id", "pri", "title"], rows);
    }
    Ok(out.heading("Next").list(next))
}
