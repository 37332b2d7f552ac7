//! `instances`, `inspect`, `stop`, `rm`: instance management from the
//! command line, through the same providers the daemon uses.

use tuixiu_sandbox::provider::docker::DockerProvider;
use tuixiu_sandbox::provider::host::HostProvider;
use tuixiu_sandbox::provider::native::NativeProvider;
use tuixiu_sandbox::provider::{
    AnyProvider, InstanceInfo, InstanceStatus, Provider, ProviderError, default_state_dir,
};

use super::error::CmdError;
use crate::cli::{InstanceArgs, InstancesArgs, ProviderArg, ProviderOptions};
use crate::{EXIT_TOOL_ERROR, report_error};

fn provider(kind: ProviderArg, options: &ProviderOptions) -> Result<AnyProvider, ProviderError> {
    let state = options.state_dir.clone().unwrap_or_else(default_state_dir);
    let prefix = options.instance_prefix.as_str();
    Ok(match kind {
        ProviderArg::Native => AnyProvider::Native(NativeProvider::with_current_exe(&state, prefix)?),
        ProviderArg::Docker => {
            AnyProvider::Docker(DockerProvider::new(&options.container_cli, &state, prefix)?)
        }
        // Managing host instances runs nothing: no acknowledgement needed.
        ProviderArg::Host => AnyProvider::Host(HostProvider::new(&state, prefix, false)?),
    })
}

fn block_on<F: Future>(future: F) -> Result<F::Output, CmdError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(CmdError::Runtime)?;
    Ok(rt.block_on(future))
}

/// Runs `body`, printing its error as one line and mapping it to 125.
fn exit(body: impl FnOnce() -> Result<(), CmdError>) -> u8 {
    match body() {
        Ok(()) => 0,
        Err(e) => {
            report_error(e);
            EXIT_TOOL_ERROR
        }
    }
}

pub fn list(args: InstancesArgs) -> u8 {
    exit(|| {
        let kinds = match args.provider {
            Some(kind) => vec![kind],
            None => vec![ProviderArg::Native, ProviderArg::Host, ProviderArg::Docker],
        };
        let mut all = Vec::new();
        for kind in kinds {
            let p = provider(kind, &args.options)?;
            match block_on(p.list())? {
                Ok(list) => all.extend(list),
                // Listing everything: an engine that is not installed or not
                // running is said, not fatal.
                Err(e) if args.provider.is_none() && kind == ProviderArg::Docker => {
                    eprintln!("tuixiu-sandbox: docker instances not listed: {e}");
                }
                Err(e) => return Err(e.into()),
            }
        }
        if args.json {
            println!("{}", serde_json::to_string_pretty(&all).expect("plain data"));
        } else {
            print_table(&all);
        }
        Ok(())
    })
}

fn print_table(infos: &[InstanceInfo]) {
    let rows: Vec<[String; 6]> = infos
        .iter()
        .map(|i| {
            [
                i.name.clone(),
                i.kind.cli_name().to_string(),
                i.status.as_str().to_string(),
                i.run_id.clone().unwrap_or_else(|| "-".into()),
                i.created_at.clone().unwrap_or_else(|| "-".into()),
                i.egress.map_or_else(|| "-".into(), |c| c.denied.to_string()),
            ]
        })
        .collect();
    let header = ["NAME", "PROVIDER", "STATUS", "RUN ID", "CREATED", "DENIED"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", line.join("  ").trim_end());
    }
}

/// The provider that has `name`: the one asked for, else the first of
/// native, host, docker that knows it (docker is asked only if neither
/// local provider has a record).
fn find(args: &InstanceArgs) -> Result<(AnyProvider, InstanceInfo), CmdError> {
    let kinds = match args.provider {
        Some(kind) => vec![kind],
        None => vec![ProviderArg::Native, ProviderArg::Host, ProviderArg::Docker],
    };
    let last = kinds.len() - 1;
    for (i, kind) in kinds.into_iter().enumerate() {
        let p = provider(kind, &args.options)?;
        let info = block_on(p.inspect(&args.name))??;
        if info.status != InstanceStatus::Missing {
            return Ok((p, info));
        }
        if i == last {
            return Ok((p, info));
        }
    }
    unreachable!("at least one provider is tried")
}

fn print_info(info: &InstanceInfo, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(info).expect("plain data"));
        return;
    }
    println!("name:       {}", info.name);
    println!("provider:   {} ({})", info.kind.cli_name(), info.provider);
    println!("status:     {}", info.status.as_str());
    let fields = [
        ("run id", info.run_id.clone()),
        ("created at", info.created_at.clone()),
        ("runtime", info.runtime.clone()),
        ("image", info.image.clone()),
        ("id", info.id.clone()),
        ("workspace", info.workspace.as_ref().map(|w| w.display().to_string())),
        ("last error", info.last_error.clone()),
        (
            "egress",
            info.egress.map(|c| {
                format!(
                    "{} denied, {} failed, {} connections ({} open), {} bytes out, {} bytes in",
                    c.denied, c.failed, c.connections, c.open, c.bytes_out, c.bytes_in
                )
            }),
        ),
    ];
    for (label, value) in fields {
        if let Some(value) = value {
            println!("{:<11} {value}", format!("{label}:"));
        }
    }
}

pub fn inspect(args: InstanceArgs) -> u8 {
    exit(|| {
        let (_, info) = find(&args)?;
        print_info(&info, args.json);
        Ok(())
    })
}

pub fn stop(args: InstanceArgs) -> u8 {
    exit(|| {
        let (p, _) = find(&args)?;
        let info = block_on(p.stop(&args.name))??;
        print_info(&info, args.json);
        Ok(())
    })
}

pub fn remove(args: InstanceArgs) -> u8 {
    exit(|| {
        let (p, _) = find(&args)?;
        let info = block_on(p.remove(&args.name))??;
        print_info(&info, args.json);
        Ok(())
    })
}
