//! Which nodes are virtual: a taint (Kosmos marks its virtual nodes with
//! `kosmos.io/node=true:NoSchedule`) or a label, parsed from one flag value.
//!
//! The syntax follows `kubectl taint` / `kubectl label`, prefixed with what
//! is matched: `taint:KEY[=VALUE]:EFFECT` or `label:KEY=VALUE`. Keys and
//! values are checked with the API server's own rules, so a typo fails at
//! start-up instead of silently matching no node.

use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::Node;

/// The selector used when none is given: Kosmos' virtual-node taint.
pub const DEFAULT_SELECTOR: &str = "taint:kosmos.io/node=true:NoSchedule";

const SYNTAX: &str = "expected `taint:KEY[=VALUE]:EFFECT` or `label:KEY=VALUE`";

/// The effect of a taint, as the API spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// The nodes the registrar registers the driver on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeSelector {
    /// Nodes carrying this taint (an absent taint value equals "").
    Taint {
        key: String,
        value: String,
        effect: TaintEffect,
    },
    /// Nodes carrying this label with this value.
    Label { key: String, value: String },
}

/// A selector string that does not parse; the message says why and what is
/// expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid virtual node selector {input:?}: {reason} ({SYNTAX})")]
pub struct SelectorError {
    pub input: String,
    pub reason: String,
}

impl NodeSelector {
    /// Whether `node` is one of the selected nodes.
    pub fn matches(&self, node: &Node) -> bool {
        match self {
            NodeSelector::Taint { key, value, effect } => node
                .spec
                .as_ref()
                .and_then(|spec| spec.taints.as_ref())
                .is_some_and(|taints| {
                    taints.iter().any(|t| {
                        t.key == *key
                            && t.effect == effect.as_str()
                            && t.value.as_deref().unwrap_or_default() == value
                    })
                }),
            NodeSelector::Label { key, value } => node
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(key))
                .is_some_and(|v| v == value),
        }
    }
}

impl Default for NodeSelector {
    fn default() -> Self {
        NodeSelector::Taint {
            key: "kosmos.io/node".into(),
            value: "true".into(),
            effect: TaintEffect::NoSchedule,
        }
    }
}

impl fmt::Display for NodeSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeSelector::Taint { key, value, effect } if value.is_empty() => {
                write!(f, "taint:{key}:{}", effect.as_str())
            }
            NodeSelector::Taint { key, value, effect } => {
                write!(f, "taint:{key}={value}:{}", effect.as_str())
            }
            NodeSelector::Label { key, value } => write!(f, "label:{key}={value}"),
        }
    }
}

impl FromStr for NodeSelector {
    type Err = SelectorError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let fail = |reason: String| SelectorError {
            input: input.to_string(),
            reason,
        };
        if let Some(rest) = input.strip_prefix("taint:") {
            let (key_value, effect) = rest
                .rsplit_once(':')
                .ok_or_else(|| fail("the taint has no `:EFFECT`".into()))?;
            let effect = match effect {
                "NoSchedule" => TaintEffect::NoSchedule,
                "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
                "NoExecute" => TaintEffect::NoExecute,
                other => {
                    return Err(fail(format!(
                        "taint effect {other:?} is not NoSchedule, PreferNoSchedule or NoExecute"
                    )))
                }
            };
            let (key, value) = key_value.split_once('=').unwrap_or((key_value, ""));
            check_key(key).map_err(|r| fail(format!("taint key {key:?} {r}")))?;
            check_value(value).map_err(|r| fail(format!("taint value {value:?} {r}")))?;
            Ok(NodeSelector::Taint {
                key: key.into(),
                value: value.into(),
                effect,
            })
        } else if let Some(rest) = input.strip_prefix("label:") {
            let (key, value) = rest
                .split_once('=')
                .ok_or_else(|| fail("the label has no `=VALUE`".into()))?;
            check_key(key).map_err(|r| fail(format!("label key {key:?} {r}")))?;
            check_value(value).map_err(|r| fail(format!("label value {value:?} {r}")))?;
            Ok(NodeSelector::Label {
                key: key.into(),
                value: value.into(),
            })
        } else {
            Err(fail("it starts with neither `taint:` nor `label:`".into()))
        }
    }
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters: a
/// label value (when non-empty) and the name part of a key.
fn check_name(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err(format!("is {} characters long, over 63", s.len()));
    }
    let alnum = |c: u8| c.is_ascii_alphanumeric();
    let bytes = s.as_bytes();
    let ends_ok =
        bytes.first().copied().is_some_and(alnum) && bytes.last().copied().is_some_and(alnum);
    let inner_ok = bytes
        .iter()
        .all(|&c| alnum(c) || c == b'-' || c == b'_' || c == b'.');
    if ends_ok && inner_ok {
        Ok(())
    } else {
        Err("must start and end with a letter or digit and hold only letters, digits, '-', '_' and '.'".into())
    }
}

/// A DNS-1123 subdomain: the prefix of a key.
fn check_subdomain(s: &str) -> Result<(), String> {
    if s.len() > 253 {
        return Err(format!("is {} characters long, over 253", s.len()));
    }
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        b.first().copied().is_some_and(edge)
            && b.last().copied().is_some_and(edge)
            && b.iter().all(|&c| edge(c) || c == b'-')
    };
    if s.split('.').all(label_ok) {
        Ok(())
    } else {
        Err("must be a lowercase DNS subdomain".into())
    }
}

/// Checks a label or taint key (`[prefix/]name`), as the API server does.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("is empty".into());
    }
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        check_subdomain(prefix).map_err(|r| format!("has a prefix that {r}"))?;
    }
    check_name(name).map_err(|r| format!("has a name part that {r}"))
}

/// Checks a label or taint value (empty is allowed), as the API server does.
pub fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    check_name(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn parse(s: &str) -> Result<NodeSelector, SelectorError> {
        s.parse()
    }

    fn reason(s: &str) -> String {
        let err = parse(s).expect_err(s);
        assert_eq!(err.input, s);
        let shown = err.to_string();
        assert!(shown.contains(SYNTAX), "{shown}");
        err.reason
    }

    #[test]
    fn the_default_is_the_kosmos_taint() {
        assert_eq!(parse(DEFAULT_SELECTOR).unwrap(), NodeSelector::default());
        assert_eq!(NodeSelector::default().to_string(), DEFAULT_SELECTOR);
    }

    #[test]
    fn valid_selectors_parse_and_print_back() {
        let cases = [
            (
                "taint:kosmos.io/node=true:NoSchedule",
                NodeSelector::Taint {
                    key: "kosmos.io/node".into(),
                    value: "true".into(),
                    effect: TaintEffect::NoSchedule,
                },
            ),
            (
                "taint:virtual-kubelet.io/provider:NoExecute",
                NodeSelector::Taint {
                    key: "virtual-kubelet.io/provider".into(),
                    value: "".into(),
                    effect: TaintEffect::NoExecute,
                },
            ),
            (
                "taint:dedicated=relay:PreferNoSchedule",
                NodeSelector::Taint {
                    key: "dedicated".into(),
                    value: "relay".into(),
                    effect: TaintEffect::PreferNoSchedule,
                },
            ),
            (
                "label:type=virtual-kubelet",
                NodeSelector::Label {
                    key: "type".into(),
                    value: "virtual-kubelet".into(),
                },
            ),
            (
                "label:kosmos.io/node=",
                NodeSelector::Label {
                    key: "kosmos.io/node".into(),
                    value: "".into(),
                },
            ),
        ];
        for (input, want) in cases {
            let got = parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(got, want, "{input}");
            assert_eq!(got.to_string(), input);
        }
    }

    #[test]
    fn invalid_selectors_say_what_is_wrong() {
        assert!(reason("kosmos.io/node=true:NoSchedule").contains("neither `taint:` nor `label:`"));
        assert!(reason("").contains("neither"));
        assert!(reason("Taint:a=b:NoSchedule").contains("neither"));
        assert!(reason("taint:kosmos.io/node=true").contains("no `:EFFECT`"));
        assert!(reason("taint:kosmos.io/node=true:").contains("effect \"\" is not"));
        assert!(reason("taint:kosmos.io/node").contains("no `:EFFECT`"));
        assert!(reason("taint:a=b:noschedule").contains("effect \"noschedule\""));
        assert!(reason("taint:=true:NoSchedule").contains("taint key \"\" is empty"));
        assert!(reason("taint:Kosmos.IO/node=true:NoSchedule").contains("DNS subdomain"));
        assert!(reason("taint:a/b/c=1:NoSchedule").contains("name part"));
        assert!(reason("taint:a=b c:NoSchedule").contains("taint value \"b c\""));
        assert!(reason("taint:a=b=c:NoSchedule").contains("taint value \"b=c\""));
        assert!(reason("label:type").contains("no `=VALUE`"));
        assert!(reason("label:=x").contains("label key \"\" is empty"));
        assert!(reason("label:-x=y").contains("label key \"-x\""));
        assert!(reason(&format!("label:a={}", "v".repeat(64))).contains("over 63"));
        assert!(reason(&format!("label:{}.io/a=b", "p".repeat(254))).contains("over 253"));
    }

    fn node(labels: &[(&str, &str)], taints: &[(&str, Option<&str>, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(
                    taints
                        .iter()
                        .map(|(key, value, effect)| Taint {
                            key: key.to_string(),
                            value: value.map(str::to_string),
                            effect: effect.to_string(),
                            time_added: None,
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn taint_selectors_need_key_value_and_effect() {
        let sel = NodeSelector::default();
        assert!(sel.matches(&node(
            &[],
            &[("kosmos.io/node", Some("true"), "NoSchedule")]
        )));
        assert!(!sel.matches(&node(&[], &[("kosmos.io/node", Some("true"), "NoExecute")])));
        assert!(!sel.matches(&node(
            &[],
            &[("kosmos.io/node", Some("false"), "NoSchedule")]
        )));
        assert!(!sel.matches(&node(&[("kosmos.io/node", "true")], &[])));
        assert!(!sel.matches(&Node::default()));
        let no_value: NodeSelector = "taint:vk:NoSchedule".parse().unwrap();
        assert!(no_value.matches(&node(&[], &[("vk", None, "NoSchedule")])));
        assert!(no_value.matches(&node(&[], &[("vk", Some(""), "NoSchedule")])));
        assert!(!no_value.matches(&node(&[], &[("vk", Some("x"), "NoSchedule")])));
    }

    #[test]
    fn label_selectors_need_the_value() {
        let sel: NodeSelector = "label:type=virtual-kubelet".parse().unwrap();
        assert!(sel.matches(&node(&[("type", "virtual-kubelet")], &[])));
        assert!(!sel.matches(&node(&[("type", "real")], &[])));
        assert!(!sel.matches(&node(
            &[],
            &[("type", Some("virtual-kubelet"), "NoSchedule")]
        )));
        assert!(!sel.matches(&Node::default()));
    }
}
