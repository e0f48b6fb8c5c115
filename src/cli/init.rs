//! `loopx init`: create `.loopx/` in a project directory.

use serde_json::json;

use super::Context;
use super::output::Output;
use crate::error::Result;
use crate::kernel::Kernel;

#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// Project directory (default: --root, LOOPX_ROOT, or the working directory).
    #[arg(value_parser = super::flags::path)]
    pub dir: Option<std::path::PathBuf>,
}

pub fn run(ctx: &Context, args: InitArgs) -> Result<Output> {
    let dir = match args.dir.or_else(|| ctx.root.clone()) {
        Some(dir) => ctx.absolute(&dir)?,
        None => ctx.cwd()?.to_path_buf(),
    };
    let created = Kernel::init(&dir)?.is_some();
    let paths = crate::paths::ProjectPaths::at(&dir);
    let state = paths.state.display().to_string();
    Ok(
        Output::new(json!({"created": created, "state_dir": state, "database": paths.db()}))
            .heading(if created {
                "Initialized LoopX project"
            } else {
                "LoopX project already initialized"
            })
            .fields([
                ("state", state),
                ("next", "loopx goal create --title \"...\"".to_string()),
            ]),
    )
}
