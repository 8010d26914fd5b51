//! The operating system: what is mounted (mountinfo), mount/unmount
//! syscalls, loop devices, filesystems and the tools that make them, and
//! what a directory holds. No CSI types here.
//!
//! May import: `csi`, `domain`, `rt`.

pub mod dir_usage;
pub mod filesystem;
pub mod freeze;
pub mod helper;
pub mod loopdev;
pub mod mount_point;
pub mod mountinfo;
pub mod nfs;
pub mod options;
pub mod syscalls;
pub mod target_path;
