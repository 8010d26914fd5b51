//! The domain: what a volume, a snapshot, a capability and a StorageClass
//! parameter are, which requests are valid, and the state machine that
//! says what each call means for a volume's record. No I/O happens here:
//! everything is a value in, a value (or a `CsiError`) out.
//!
//! May import: `csi`.

pub mod capability;
pub mod error;
pub mod member_source;
pub mod observers;
pub mod page_token;
pub mod params;
pub mod quantity;
pub mod settings;
pub mod sharing;
pub mod state;
pub mod topology;
pub mod validate;
pub mod volume;
