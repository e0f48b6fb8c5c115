//! `loopx-serve`: the dashboard's executable, run by `loopx serve` (see the crate's library).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use loopx::cli::output::Format;
use loopx::error::{LoopxError, bad_input, not_found};
use loopx::paths::ProjectPaths;
use loopx_serve::{Config, check_config, load_token, router, serve_until, watch_changes};

#[derive(Debug, Parser)]
#[command(
    name = "loopx-serve",
    version,
    about = "LoopX's read-only web dashboard and JSON API (usually run as `loopx serve`)"
)]
struct Args {
    /// Project directory holding `.loopx/` (default: search upward from the working directory).
    #[arg(long, env = "LOOPX_ROOT", value_name = "DIR")]
    root: Option<PathBuf>,
    /// Address and port to listen on; an address other than loopback requires a token.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7878")]
    listen: String,
    /// Token every request must carry (Authorization: Bearer, or ?token= once, then a cookie).
    #[arg(long, value_name = "TOKEN", conflicts_with = "token_file")]
    token: Option<String>,
    /// File holding the token (its first line).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// How a failure to start is reported: `json` prints the error envelope `loopx --format
    /// json` prints (`loopx serve` passes its own `--format`).
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let format = args.format;
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            loopx::cli::report_error(&err, format);
            ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(1))
        }
    }
}

/// A failure of the machine to give the server what it needs (a port, a thread): exit 6.
fn io_failure(context: String, source: std::io::Error) -> LoopxError {
    LoopxError::Io {
        path: PathBuf::new(),
        context,
        source,
    }
}

fn serve(args: Args) -> loopx::Result<()> {
    let listen: SocketAddr = parse_listen(&args.listen).ok_or_else(|| {
        bad_input(format!(
            "--listen {:?} is not an address and port; use e.g. 127.0.0.1:7878, [::1]:7878 or localhost:7878",
            args.listen
        ))
    })?;
    let file = args.token_file.clone();
    let token = load_token(args.token, args.token_file).map_err(|e| {
        let path = file.clone().unwrap_or_default();
        let message = format!(
            "reading the token file {}: {e}; pass an existing file with --token-file",
            path.display()
        );
        // As `loopx` classifies them: a file that is not there, one that holds no token line,
        // one the machine would not let us read.
        match e.kind() {
            std::io::ErrorKind::NotFound => not_found(message),
            std::io::ErrorKind::InvalidData => bad_input(message),
            _ => LoopxError::Io {
                context: format!("reading the token file {}", path.display()),
                path,
                source: e,
            },
        }
    })?;
    check_config(listen, token.as_deref()).map_err(|e| bad_input(e.to_string()))?;
    let paths = ProjectPaths::discover(args.root.as_deref(), loopx::paths::working_directory)?;
    // Opening the project once up front reports a damaged or missing one before listening, and
    // one whose schema is older than this build reads (`loopx serve` upgrades it first).
    loopx::kernel::Kernel::open_with(paths.clone(), loopx::kernel::SchemaUpgrade::Refuse)?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| io_failure("starting the runtime".to_string(), e))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| io_failure(format!("listening on {listen}"), e))?;
        let bound = listener
            .local_addr()
            .map_err(|e| io_failure("reading the listening address".to_string(), e))?;
        let (changes, _) = tokio::sync::broadcast::channel(64);
        let watcher_paths = paths.clone();
        let sender = changes.clone();
        std::thread::Builder::new()
            .name("loopx-watch".into())
            .spawn(move || {
                watch_changes(&watcher_paths, sender, |e| {
                    eprintln!(
                        "loopx-serve: warning: live updates paused until the project's database \
                         can be read again: {e}"
                    )
                })
            })
            .map_err(|e| io_failure("starting the change watcher".to_string(), e))?;
        let app = router(
            Config {
                paths: paths.clone(),
                listen: bound,
                token,
            },
            changes,
        );
        // The one line a script (or the browser test) reads to find the port.
        println!(
            "loopx-serve: serving {} at http://{bound}/",
            paths.project.display()
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();
        // Not `axum::serve`: it waits for a request's headers forever (see `serve_until`).
        serve_until(listener, app, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
        Ok(())
    })
}

/// `--listen`: an IP address and port, or `localhost:PORT` (the IPv4 loopback, which is what the
/// Host check accepts `localhost` for). No other name is resolved: the address a server binds
/// should not depend on DNS.
fn parse_listen(text: &str) -> Option<SocketAddr> {
    text.parse().ok().or_else(|| {
        let (name, port) = text.rsplit_once(':')?;
        let port = port.parse::<u16>().ok()?;
        name.eq_ignore_ascii_case("localhost")
            .then(|| SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)))
    })
}

#[cfg(test)]
mod tests {
    use super::parse_listen;

    #[test]
    fn listen_takes_an_address_or_localhost() {
        assert_eq!(
            parse_listen("127.0.0.1:7878"),
            Some("127.0.0.1:7878".parse().unwrap())
        );
        assert_eq!(parse_listen("[::1]:0"), Some("[::1]:0".parse().unwrap()));
        assert_eq!(
            parse_listen("localhost:7878"),
            Some("127.0.0.1:7878".parse().unwrap())
        );
        assert_eq!(
            parse_listen("LOCALHOST:1"),
            Some("127.0.0.1:1".parse().unwrap())
        );
        for bad in [
            "localhost",
            "example.com:80",
            "localhost:x",
            "nonsense",
            ":80",
        ] {
            assert_eq!(parse_listen(bad), None, "{bad}");
        }
    }
}
