//! The CSI v1 protocol types and service traits generated from proto/csi.proto.
#![allow(clippy::all, clippy::pedantic, missing_docs)]

tonic::include_proto!("csi.v1");
