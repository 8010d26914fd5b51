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

{{- define "csi-relay-member.emit" -}}
{{- range . }}
---
{{ toYaml . }}
{{- end }}
{{- end -}}
