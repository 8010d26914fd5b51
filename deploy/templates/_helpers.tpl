{{/*
The chart renders the manifests of the Kustomize base (the files of deploy/)
with the values applied: these helpers read a manifest and change what the
values name. Each returns YAML (templates return only text), which the
caller parses back.
*/}}

{{/* The objects of the base manifest .file, as a YAML list. */}}
{{- define "csi-relay.docs" -}}
{{- $text := .root.Files.Get .file -}}
{{- if not $text -}}{{- fail (printf "the chart holds no %s (the Kustomize base's manifest)" .file) -}}{{- end -}}
{{- $docs := list -}}
{{- range $raw := regexSplit "(?m)^---[ \t]*$" $text -1 -}}
{{- $doc := fromYaml $raw -}}
{{- if hasKey $doc "Error" -}}{{- fail (printf "%s: %s" $.file $doc.Error) -}}{{- end -}}
{{- if $doc -}}{{- $docs = append $docs $doc -}}{{- end -}}
{{- end -}}
{{- toYaml $docs -}}
{{- end -}}

{{/*
Objects as YAML documents, each put where the release puts it: the base's
namespace csi-relay (the controller's) is the release's namespace, and
csi-relay-node (the node plugin's) is node.namespace, in the objects and in
the subjects of their bindings. .root: the chart's root; .docs: the objects.
*/}}
{{- define "csi-relay.emit" -}}
{{- $places := dict "csi-relay" .root.Release.Namespace "csi-relay-node" .root.Values.node.namespace -}}
{{- range .docs }}
{{- if and .metadata .metadata.namespace (hasKey $places .metadata.namespace) }}
{{- $_ := set .metadata "namespace" (get $places .metadata.namespace) }}
{{- end }}
{{- range .subjects | default list }}
{{- if and .namespace (hasKey $places .namespace) }}{{ $_ := set . "namespace" (get $places .namespace) }}{{ end }}
{{- end }}
---
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A name the relay takes as a member's (a DNS label). */}}
{{- define "csi-relay.memberName" -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" (toString .)) -}}
{{- fail (printf "member name %q: a member is named by a DNS label (lower-case letters, digits and '-', at most 63)" (toString .)) -}}
{{- end -}}
{{- . -}}
{{- end -}}

{{/*
The csi-relay container's args with the values applied: the members in
place of the base's --member, --node-member, the registrar, the driver name,
the log format and extra args. .args: the base's; .v: the values; .extra.
*/}}
{{- define "csi-relay.relayArgs" -}}
{{- $v := .v -}}
{{- $out := list -}}
{{- $members := false -}}
{{- range $a := .args -}}
{{- if hasPrefix "--member=" $a -}}
{{- if not $members -}}
{{- range $m := $v.members -}}
{{- $name := include "csi-relay.memberName" $m -}}
{{- $out = append $out (printf "--member=%s=/etc/csi-relay/members/%s" $name $name) -}}
{{- end -}}
{{- $members = true -}}
{{- end -}}
{{- else if hasPrefix "--node-member=" $a -}}
{{- with $v.node.member -}}
{{- $out = append $out (printf "--node-member=%s" (include "csi-relay.memberName" .)) -}}
{{- end -}}
{{- else if and (eq $a "--virtual-node-registrar") (not $v.controller.virtualNodeRegistrar) -}}
{{- else -}}
{{- $out = append $out $a -}}
{{- end -}}
{{- end -}}
{{- if ne $v.driverName "relay.csi.dev" -}}
{{- $out = append $out (printf "--driver-name=%s" $v.driverName) -}}
{{- end -}}
{{- if not (has $v.logFormat (list "text" "json")) -}}
{{- fail (printf "logFormat %q: text or json" (toString $v.logFormat)) -}}
{{- end -}}
{{- if ne $v.logFormat "text" -}}
{{- $out = append $out (printf "--log-format=%s" $v.logFormat) -}}
{{- end -}}
{{- range .extra -}}
{{- $out = append $out . -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
The feature gates a sidecar .name runs with beyond the base's, as a YAML map
(gate: "true"/"false"): the gates its README says need a newer Kubernetes
than the cluster's (.Capabilities.KubeVersion: the API server's at install
and upgrade, --kube-version for helm template), turned off, as the
kubernetes-1.28-1.31 component does for `kubectl apply -k`; then
sidecars.featureGates, which win.
*/}}
{{- define "csi-relay.gates" -}}
{{- $gates := dict -}}
{{- $kube := .root.Capabilities.KubeVersion.Version -}}
{{- if and (eq .name "csi-resizer") (semverCompare "<1.32.0-0" $kube) -}}
{{- /* external-resizer v2.2.1: "Use of this feature-gate requires Kubernetes 1.32." */ -}}
{{- $_ := set $gates "RecoverVolumeExpansionFailure" "false" -}}
{{- end -}}
{{- with get (.root.Values.sidecars.featureGates | default dict) .name -}}
{{- range $gate, $on := . }}{{ $_ := set $gates $gate (toString $on) }}{{ end -}}
{{- end -}}
{{- toYaml $gates -}}
{{- end -}}

{{/*
A pod template's spec with the values applied. .spec: the base's (changed
in place); .v: the values; .role: the values of controller or node; .root:
the chart's root.
*/}}
{{- define "csi-relay.podSpec" -}}
{{- $v := .v -}}
{{- $root := .root -}}
{{- $role := .role -}}
{{- $spec := .spec -}}
{{- $kubelet := trimSuffix "/" ($role.kubeletDir | default "/var/lib/kubelet") -}}
{{- $plugins := printf "%s/plugins/%s" $kubelet $v.driverName -}}
{{- with $role.nodeSelector }}{{ $_ := set $spec "nodeSelector" . }}{{ end -}}
{{- with $role.tolerations }}{{ $_ := set $spec "tolerations" . }}{{ end -}}
{{- with $role.affinity }}{{ $_ := set $spec "affinity" . }}{{ end -}}
{{- with $v.imagePullSecrets }}{{ $_ := set $spec "imagePullSecrets" . }}{{ end -}}
{{- range $c := $spec.containers -}}
{{- with index $v.images $c.name }}{{ $_ := set $c "image" . }}{{ end -}}
{{- with $v.imagePullPolicy }}{{ $_ := set $c "imagePullPolicy" . }}{{ end -}}
{{- with $role.extraEnv }}{{ $_ := set $c "env" (concat ($c.env | default list) .) }}{{ end -}}
{{- $args := list -}}
{{- if eq $c.name "csi-relay" -}}
{{- $extra := $role.extraArgs | default list -}}
{{- if ne $kubelet "/var/lib/kubelet" }}{{ $extra = prepend $extra (printf "--plugins-dir=%s/plugins" $kubelet) }}{{ end -}}
{{- $args = include "csi-relay.relayArgs" (dict "args" $c.args "v" $v "extra" $extra) | fromYamlArray -}}
{{- with $role.resources }}{{ $_ := set $c "resources" . }}{{ end -}}
{{- range $m := $c.volumeMounts }}{{ if eq $m.name "kubelet-dir" }}{{ $_ := set $m "mountPath" $kubelet }}{{ end }}{{ end -}}
{{- with $role.extraVolumeMounts }}{{ $_ := set $c "volumeMounts" (concat $c.volumeMounts .) }}{{ end -}}
{{- with $v.healthAddress -}}
{{- with $c.livenessProbe }}{{ $_ := set .httpGet "host" $v.healthAddress }}{{ end -}}
{{- end -}}
{{- else -}}
{{- with $v.sidecars.resources }}{{ $_ := set $c "resources" . }}{{ end -}}
{{- $gates := include "csi-relay.gates" (dict "root" $root "name" $c.name) | fromYaml -}}
{{- $gated := false -}}
{{- range $a := $c.args -}}
{{- if hasPrefix "--kubelet-registration-path=" $a -}}
{{- $a = printf "--kubelet-registration-path=%s/csi.sock" $plugins -}}
{{- else if and $v.healthAddress (hasPrefix "--http-endpoint=:" $a) -}}
{{- $a = printf "--http-endpoint=%s%s" $v.healthAddress (trimPrefix "--http-endpoint=" $a) -}}
{{- else if and $gates (hasPrefix "--feature-gates=" $a) -}}
{{- range $g := keys $gates | sortAlpha }}{{ $a = printf "%s,%s=%s" $a $g (get $gates $g) }}{{ end -}}
{{- $gated = true -}}
{{- end -}}
{{- $args = append $args $a -}}
{{- end -}}
{{- if and $gates (not $gated) -}}
{{- $list := list -}}
{{- range $g := keys $gates | sortAlpha }}{{ $list = append $list (printf "%s=%s" $g (get $gates $g)) }}{{ end -}}
{{- $args = append $args (printf "--feature-gates=%s" (join "," $list)) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $c "args" $args -}}
{{- end -}}
{{- range $vol := $spec.volumes -}}
{{- if $vol.hostPath -}}
{{- if eq $vol.name "plugin-dir" }}{{ $_ := set $vol.hostPath "path" $plugins }}{{ end -}}
{{- if eq $vol.name "registration-dir" }}{{ $_ := set $vol.hostPath "path" (printf "%s/plugins_registry" $kubelet) }}{{ end -}}
{{- if eq $vol.name "kubelet-dir" }}{{ $_ := set $vol.hostPath "path" $kubelet }}{{ end -}}
{{- if and (eq $vol.name "state") $role.stateDir }}{{ $_ := set $vol.hostPath "path" $role.stateDir }}{{ end -}}
{{- end -}}
{{- end -}}
{{- with $role.extraVolumes }}{{ $_ := set $spec "volumes" (concat $spec.volumes .) }}{{ end -}}
{{- end -}}
