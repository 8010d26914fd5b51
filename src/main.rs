use clap::Parser;
use csi_relay::config::{Cli, Command, LogFormat};

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal, never in collected logs.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => match csi_relay::member::relay_volume::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("csi-relay: {e}");
                std::process::ExitCode::FAILURE
            }
        },
        Command::Serve(args) => {
            init_logging(args.log_format);
            match csi_relay::server::serve(args).await {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "csi-relay failed");
                    eprintln!("csi-relay: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
    }
}
