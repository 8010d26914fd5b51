//! `csi-relay check`: reads the host cluster and every configured member
//! and reports, one line each with its fix, what stops volumes from working
//! or will: the RelayVolume CRD, this identity's rights, the StorageClasses
//! of the driver, how host nodes map to members, and stuck volumes.
//!
//! It only reads (access and rules reviews are reads too). Exit status 0:
//! no problem; 1: problems; 2: could not check (a cluster unreachable, a
//! listing refused).

mod access;
mod classes;
mod crd;
mod nodes;
mod volumes;

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::domain::settings::DEFAULT_DRIVER_NAME;
use crate::k8s::cluster::Cluster;
use crate::k8s::connect::{self, MemberArg};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// Kubeconfig of the host cluster. Default: in-cluster config.
    #[arg(long, value_name = "PATH")]
    pub host_kubeconfig: Option<PathBuf>,

    /// A member cluster, as `serve` takes it (repeatable).
    #[arg(long = "member", value_name = "NAME=KUBECONFIG", value_parser = crate::k8s::connect::parse_member)]
    pub members: Vec<MemberArg>,

    /// A member declared lost for good, as `serve` takes it (repeatable).
    #[arg(long = "lost-member", value_name = "NAME")]
    pub lost_members: Vec<String>,

    /// The CSI driver name whose StorageClasses and nodes are checked.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    pub driver_name: String,

    /// Seconds after which a volume still PROVISIONING is reported stuck.
    #[arg(long, default_value_t = 600)]
    pub stuck_after: u64,

    /// Which nodes are virtual, as `serve` takes it.
    #[arg(long, value_name = "SELECTOR", default_value = crate::k8s::registrar::DEFAULT_SELECTOR)]
    pub virtual_node_selector: crate::k8s::registrar::NodeSelector,

    /// Node annotation naming a virtual node's member, as `serve` takes it.
    #[arg(long, value_name = "ANNOTATION", default_value = crate::k8s::registrar::KOSMOS_MEMBER_ANNOTATION)]
    pub virtual_node_member_annotation: String,

    /// `text` (a line per finding) or `json` (for scripts).
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// As it should be.
    Ok,
    /// Worth knowing, nothing to fix.
    Info,
    /// Something to fix: volumes fail or will.
    Problem,
    /// This part could not be checked.
    Unchecked,
}

/// One line of the report.
#[derive(Serialize, Debug, Clone)]
pub struct Finding {
    /// crd, access, class, node, volume, member.
    pub kind: &'static str,
    pub status: Status,
    /// What the line is about (a cluster, a class, a node, a volume).
    pub subject: String,
    pub message: String,
    /// What to do, for problems.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub fix: String,
}

impl Finding {
    pub fn ok(kind: &'static str, subject: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(kind, Status::Ok, subject, message, "")
    }
    pub fn info(
        kind: &'static str,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::new(kind, Status::Info, subject, message, "")
    }
    pub fn problem(
        kind: &'static str,
        subject: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(kind, Status::Problem, subject, message, fix)
    }
    pub fn unchecked(
        kind: &'static str,
        subject: impl Into<String>,
        why: impl Into<String>,
    ) -> Self {
        Self::new(kind, Status::Unchecked, subject, why, "")
    }
    fn new(
        kind: &'static str,
        status: Status,
        subject: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Finding {
            kind,
            status,
            subject: subject.into(),
            message: message.into(),
            fix: fix.into(),
        }
    }
}

/// The clusters a check reads.
pub struct Clusters {
    pub host: Cluster,
    /// Each configured member, or why it could not be connected to.
    pub members: Vec<(String, Result<Cluster, String>)>,
    pub lost: Vec<String>,
}

impl Clusters {
    pub fn member(&self, name: &str) -> Option<&Result<Cluster, String>> {
        self.members.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }
    pub fn is_configured(&self, name: &str) -> bool {
        self.member(name).is_some() || self.lost.iter().any(|l| l == name)
    }
}

#[derive(Serialize)]
struct Report<'a> {
    problems: usize,
    unchecked: usize,
    findings: &'a [Finding],
}

/// Runs every check and prints the report; returns the exit status.
pub async fn run(args: &CheckArgs) -> u8 {
    let findings = match check(args).await {
        Ok(f) => f,
        Err(why) => vec![Finding::unchecked("host", "host cluster", why)],
    };
    let problems = findings
        .iter()
        .filter(|f| f.status == Status::Problem)
        .count();
    let unchecked = findings
        .iter()
        .filter(|f| f.status == Status::Unchecked)
        .count();
    match args.output {
        Output::Json => {
            let report = Report {
                problems,
                unchecked,
                findings: &findings,
            };
            match serde_json::to_string_pretty(&report) {
                Ok(text) => println!("{text}"),
                Err(e) => eprintln!("csi-relay check: cannot encode the report: {e}"),
            }
        }
        Output::Text => {
            for f in &findings {
                println!("{}", text_line(f));
            }
            println!(
                "{} findings: {problems} problem(s), {unchecked} not checked",
                findings.len()
            );
        }
    }
    if unchecked > 0 {
        2
    } else if problems > 0 {
        1
    } else {
        0
    }
}

fn text_line(f: &Finding) -> String {
    let tag = match f.status {
        Status::Ok => "ok     ",
        Status::Info => "info   ",
        Status::Problem => "PROBLEM",
        Status::Unchecked => "UNCHECKED",
    };
    let mut line = format!("{tag} {:<7} {}: {}", f.kind, f.subject, f.message);
    if !f.fix.is_empty() {
        line.push_str("\n        fix: ");
        line.push_str(&f.fix);
    }
    line
}

async fn check(args: &CheckArgs) -> Result<Vec<Finding>, String> {
    let host = connect::connect_host(args.host_kubeconfig.as_deref()).await?;
    let mut members = Vec::new();
    for m in &args.members {
        members.push((m.name.clone(), connect::connect_member(m).await));
    }
    let clusters = Clusters {
        host,
        members,
        lost: args.lost_members.clone(),
    };
    let mut findings = Vec::new();
    findings.extend(crd::check(&clusters.host).await);
    findings.extend(access::check(&clusters).await);
    findings.extend(classes::check(&clusters, &args.driver_name).await);
    findings.extend(nodes::check(&clusters, args).await);
    findings.extend(volumes::check(&clusters, args.stuck_after).await);
    Ok(findings)
}
