//! The messages of a pass, in the order they go:
//!
//! 1. controller → target `Index`; target → controller `Have`… `HaveEnd`:
//!    the chunk hashes of every file the target holds;
//! 2. controller → source `Pass`, then the target's `Have`… `HaveEnd`;
//! 3. source → controller → target: `Total`, then per entry `Entry` and,
//!    for a file or volume, the chunks the target lacks (`Chunk`, or
//!    `Zero` for a chunk of zeros, left a hole), then `End` with the
//!    source's digest of everything it read;
//! 4. target → controller `Applied` with the digest of what it then holds
//!    (read back from its disk), after removing what the source no longer
//!    has.
//!
//! Either mover answers `Failed` with a reason instead, and the controller
//! compares the two digests: equal, and the source was not written during
//! the pass, is the only way a copy may serve.
//!
//! Over the members' pod networks (`Pull`), the target mover plays the
//! controller's part of 1-4 itself, with the source mover as its peer and
//! its own target side in process; the controller hears `Progress` as it
//! goes and `Pulled` with the pass's report at the end, or `Unreachable`
//! when the peer could not be reached (the pass then goes the first way).
//! New messages go last: a variant's number is its place.

use serde::{Deserialize, Serialize};

use super::tree::{Entry, Hash};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Msg {
    Index,
    Have {
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
        size: u64,
        chunks: Vec<Hash>,
    },
    HaveEnd,
    Pass,
    Apply,
    Total {
        bytes: u64,
    },
    Entry(Entry),
    Chunk {
        index: u64,
        /// Compressed with LZ4 (size-prefixed); raw otherwise.
        lz4: bool,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    Zero {
        index: u64,
        len: u32,
    },
    End {
        digest: Hash,
        entries: u64,
        bytes: u64,
    },
    Applied {
        digest: Hash,
        entries: u64,
        bytes: u64,
    },
    Failed {
        why: String,
    },
    /// Controller → target: run the pass with the source mover at `peer`
    /// (`ip:port` on the pod network) yourself.
    Pull {
        peer: String,
    },
    /// Target → controller during a `Pull`: the source's bytes read so
    /// far (sent or found equal), of the total, and the bytes sent.
    Progress {
        done: u64,
        total: u64,
        sent: u64,
    },
    /// Target → controller: the `Pull`'s pass ended with this report.
    Pulled(PassReport),
    /// Target → controller: the peer was not reached (no connection or no
    /// handshake in time); nothing was written.
    Unreachable {
        why: String,
    },
}

impl Msg {
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Index => "Index",
            Msg::Have { .. } => "Have",
            Msg::HaveEnd => "HaveEnd",
            Msg::Pass => "Pass",
            Msg::Apply => "Apply",
            Msg::Total { .. } => "Total",
            Msg::Entry(_) => "Entry",
            Msg::Chunk { .. } => "Chunk",
            Msg::Zero { .. } => "Zero",
            Msg::End { .. } => "End",
            Msg::Applied { .. } => "Applied",
            Msg::Failed { .. } => "Failed",
            Msg::Pull { .. } => "Pull",
            Msg::Progress { .. } => "Progress",
            Msg::Pulled(_) => "Pulled",
            Msg::Unreachable { .. } => "Unreachable",
        }
    }
}

/// What a pass did, as the controller (or a pulling target) tells it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PassReport {
    /// Bytes of files (or the device) the source read.
    pub total: u64,
    /// Bytes of chunks sent, as read (before compression).
    pub sent: u64,
    /// Bytes of chunks on the wire (compressed where it paid).
    pub wire: u64,
    pub entries: u64,
    pub seconds: f64,
    /// The source's and target's digests agree.
    pub verified: bool,
    pub source_digest: Hash,
    pub target_digest: Hash,
}

/// A chunk as it goes: LZ4 where that saves a tenth, raw otherwise (random
/// or already compressed data costs no second copy at the target).
pub fn pack(index: u64, bytes: &[u8]) -> Msg {
    let packed = lz4_flex::compress_prepend_size(bytes);
    if packed.len() < bytes.len() - bytes.len() / 10 {
        Msg::Chunk {
            index,
            lz4: true,
            data: packed,
        }
    } else {
        Msg::Chunk {
            index,
            lz4: false,
            data: bytes.to_vec(),
        }
    }
}

/// A chunk's bytes back; refused when larger than a chunk.
pub fn unpack(lz4: bool, data: Vec<u8>, max: usize) -> Result<Vec<u8>, String> {
    let bytes = if lz4 {
        if data.len() >= 4 {
            let mut n = [0u8; 4];
            n.copy_from_slice(&data[..4]);
            if u32::from_le_bytes(n) as usize > max {
                return Err(format!(
                    "a compressed chunk announces more than {max} bytes"
                ));
            }
        }
        lz4_flex::decompress_size_prepended(&data)
            .map_err(|e| format!("a chunk does not decompress: {e}"))?
    } else {
        data
    };
    if bytes.len() > max {
        return Err(format!(
            "a chunk of {} bytes is more than {max}",
            bytes.len()
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_compress_when_it_pays_and_come_back_whole() {
        let zeros = vec![1u8; 1 << 20];
        let Msg::Chunk { lz4, data, .. } = pack(3, &zeros) else {
            panic!("a chunk")
        };
        assert!(lz4 && data.len() < 10_000);
        assert_eq!(unpack(lz4, data, 1 << 20).expect("unpack"), zeros);
        let mut noise = vec![0u8; 1 << 16];
        blake3::Hasher::new().finalize_xof().fill(&mut noise);
        let Msg::Chunk { lz4, data, .. } = pack(0, &noise) else {
            panic!("a chunk")
        };
        assert!(!lz4, "incompressible data goes raw");
        assert_eq!(unpack(lz4, data, 1 << 20).expect("unpack"), noise);
        let bomb = lz4_flex::compress_prepend_size(&vec![0u8; 3 << 20]);
        assert!(unpack(true, bomb, 1 << 20)
            .unwrap_err()
            .contains("more than"));
    }
}
