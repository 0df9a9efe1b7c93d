{{- define "ksquad.labels" -}}
app.kubernetes.io/part-of: ksquad
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ksquad.sandboxSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.sandbox.runAsUser }}
runAsGroup: {{ .Values.sandbox.runAsUser }}
fsGroup: {{ .Values.sandbox.runAsUser }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "ksquad.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "ksquad.sandboxNamespaces" -}}
{{- $namespaces := list -}}
{{- range .Values.sandbox.namespaces }}{{ $namespaces = append $namespaces . }}{{ end -}}
{{- range .Values.pools }}{{ $namespaces = append $namespaces .namespace }}{{ end -}}
{{- $namespaces | uniq | toJson -}}
{{- end -}}
