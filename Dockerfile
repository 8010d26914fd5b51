# Builds the csi-relay image: a static-ish release binary on a slim base with
# the mount, loop and filesystem tools the node plugin shells out to.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin csi-relay

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends mount util-linux e2fsprogs xfsprogs nfs-common ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/csi-relay /usr/local/bin/csi-relay
ENTRYPOINT ["/usr/local/bin/csi-relay"]
