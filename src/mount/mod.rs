//! The mount layer: what is mounted (mountinfo), mount/unmount syscalls,
//! loop devices and filesystems. No CSI types here.

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
