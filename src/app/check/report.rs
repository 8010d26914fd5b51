//! What a check finds (a line of the report), and the clusters it reads.

use serde::Serialize;

use crate::k8s::cluster::Cluster;

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
    /// The host's Nodes, listed once for the checks that read them (or why
    /// they could not be).
    pub host_nodes: Result<Vec<k8s_openapi::api::core::v1::Node>, String>,
}

impl Clusters {
    pub fn member(&self, name: &str) -> Option<&Result<Cluster, String>> {
        self.members.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }
    pub fn is_configured(&self, name: &str) -> bool {
        self.member(name).is_some() || self.lost.iter().any(|l| l == name)
    }
}
