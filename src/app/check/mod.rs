//! `csi-relay check`: reads the host cluster and every configured member
//! and reports, one line each with its fix, what stops volumes from working
//! or will: the RelayVolume CRD, the controller's replicas and which one
//! leads, the sidecars' feature gates against the host's Kubernetes,
//! this identity's rights, the StorageClasses
//! of the driver, how host nodes map to members, and stuck volumes.
//!
//! It only reads (access and rules reviews are reads too). Exit status 0:
//! no problem; 1: problems; 2: could not check (a cluster unreachable, a
//! listing refused).

pub mod access;
mod args;
mod bindings;
mod classes;
mod crd;
mod gates;
mod movable;
mod nodes;
mod replicas;
mod report;
mod volumes;

use serde::Serialize;

pub use args::{CheckArgs, Output};
pub use report::{Clusters, Finding, Status};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

use crate::k8s::connect;

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
    let host_nodes = host
        .run(
            "list Nodes",
            Api::<Node>::all(host.client()).list(&ListParams::default()),
        )
        .await
        .map(|l| l.items)
        .map_err(|e| e.to_string());
    let clusters = Clusters {
        host,
        members,
        lost: args.lost_members.clone(),
        host_nodes,
    };
    let mut findings = Vec::new();
    findings.extend(crd::check(&clusters.host).await);
    findings.extend(
        replicas::check(
            &clusters,
            &args.driver_name,
            &args.namespace,
            &args.controller_selector,
        )
        .await,
    );
    findings.extend(gates::check(&clusters, &args.namespace, &args.controller_selector).await);
    findings.extend(access::check(&clusters, &args.namespace).await);
    let mover = movable::mover_image(&clusters, &args.namespace, &args.controller_selector).await;
    findings.extend(classes::check(&clusters, &args.driver_name, &mover).await);
    findings.extend(nodes::check(&clusters, args).await);
    findings.extend(volumes::check(&clusters, args.stuck_after).await);
    Ok(findings)
}
