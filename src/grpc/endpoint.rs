//! The `--endpoint` value: a unix socket path or a loopback-style TCP address.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl FromStr for Endpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix://") {
            if path.is_empty() || !path.starts_with('/') {
                return Err(format!(
                    "endpoint {s:?}: unix:// needs an absolute path, e.g. unix:///run/csi/csi.sock"
                ));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        if let Some(addr) = s.strip_prefix("tcp://") {
            return addr
                .parse()
                .map(Endpoint::Tcp)
                .map_err(|e| format!("endpoint {s:?}: {e}; expected tcp://HOST_IP:PORT"));
        }
        Err(format!("endpoint {s:?} must start with unix:// or tcp://"))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix://{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_forms_and_rejects_the_rest() {
        assert_eq!(
            "unix:///run/csi.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/run/csi.sock".into())
        );
        assert_eq!(
            "tcp://127.0.0.1:10000".parse::<Endpoint>().unwrap(),
            Endpoint::Tcp("127.0.0.1:10000".parse().unwrap())
        );
        assert!("unix://relative.sock".parse::<Endpoint>().is_err());
        assert!("http://x".parse::<Endpoint>().is_err());
        assert!("tcp://nohost".parse::<Endpoint>().is_err());
    }
}
