{{/*
The chart renders the manifests of this folder's Kustomize base and
components with the values applied (as the host chart does, deploy/).
*/}}

{{/* The objects of manifest .file, as a YAML list. */}}
{{- define "csi-relay-member.docs" -}}
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
Objects as YAML documents, put in the release's namespace where the base
says csi-relay: the relay's ServiceAccounts, the subjects of their bindings,
and the user name the admission policy holds to its objects. The base's
Namespace csi-relay is the release's own, which helm makes
(--create-namespace) or which exists: it is left out. .root: the chart's
root; .docs: the objects.
*/}}
{{- define "csi-relay-member.emit" -}}
{{- $ns := .root.Release.Namespace -}}
{{- range .docs }}
{{- if not (and (eq .kind "Namespace") (eq .metadata.name "csi-relay")) }}
{{- if eq (.metadata.namespace | default "") "csi-relay" }}{{ $_ := set .metadata "namespace" $ns }}{{ end }}
{{- range .subjects | default list }}
{{- if eq (.namespace | default "") "csi-relay" }}{{ $_ := set . "namespace" $ns }}{{ end }}
{{- end }}
{{- range (.spec | default dict).matchConditions | default list }}
{{- $_ := set . "expression" (replace "'system:serviceaccount:csi-relay:" (printf "'system:serviceaccount:%s:" $ns) .expression) }}
{{- end }}
---
{{ toYaml . }}
{{- end }}
{{- end }}
{{- end -}}
