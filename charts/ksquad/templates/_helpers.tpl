{{- /* Values that cannot work are refused at install, with what to set. */ -}}
{{- define "ksquad.validate" -}}
{{- if not .Values.namespaces -}}
{{- fail "\n\nnamespaces is empty: set the namespaces your Runs live in, for example\n  --set 'namespaces={ksquad-system,payments}'\nThe bridge watches Runs only there, and the bridge and the worker get Roles only there (no cluster-wide grant to either)." -}}
{{- end -}}
{{- if not .Values.temporal.address -}}
{{- fail "\n\ntemporal.address is empty: set Temporal's frontend, for example --set temporal.address=temporal-frontend.temporal.svc:7233" -}}
{{- end -}}
{{- if has .Release.Namespace .Values.namespaces -}}
{{- fail (printf "\n\nnamespaces must not include the release namespace %s: it holds ksquad's database URL and codec key, which nothing a Run author controls may reach. Install into a namespace of its own (for example -n ksquad) and list the Run namespaces." .Release.Namespace) -}}
{{- end -}}
{{- range .Values.sandbox.allowedRuntimeClasses -}}
{{- if not (hasKey $.Values.sandbox.runtimeClasses .) -}}
{{- fail (printf "\n\nsandbox.allowedRuntimeClasses names %s, which sandbox.runtimeClasses does not map to a RuntimeClass" .) -}}
{{- end -}}
{{- end -}}
{{- if not .Values.database.urlSecret.name -}}
{{- fail "\n\ndatabase.urlSecret.name is empty: name the Secret that holds the PostgreSQL URL (key database.urlSecret.key)" -}}
{{- end -}}
{{- if and .Values.tracing.sandboxes.enabled (not (.Values.tracing.sandboxes.otlpEndpoint | default .Values.tracing.otlpEndpoint)) -}}
{{- fail "\n\ntracing.sandboxes.enabled needs a collector: set tracing.otlpEndpoint (or tracing.sandboxes.otlpEndpoint), for example http://otel-collector.observability:4318" -}}
{{- end -}}
{{- end -}}

{{- /* MutatingAdmissionPolicy v1, served from Kubernetes 1.36: found by discovery on install; `helm template`
       knows it only from --api-versions admissionregistration.k8s.io/v1/MutatingAdmissionPolicy. */ -}}
{{- define "ksquad.mutatingAdmission" -}}
{{- if and .Values.admission.enabled (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy") -}}
true
{{- end -}}
{{- end -}}

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
{{- range .Values.namespaces }}{{ $namespaces = append $namespaces . }}{{ end -}}
{{- range .Values.pools }}{{ $namespaces = append $namespaces .namespace }}{{ end -}}
{{- $namespaces | uniq | toJson -}}
{{- end -}}


{{- define "ksquad.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "ksquad.agentImage" -}}
{{ .Values.sandbox.image | default (printf "%s-agent:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion)) }}
{{- end -}}

{{- define "ksquad.temporalEnv" -}}
- {name: KSQUAD_TEMPORAL_ADDRESS, value: {{ .Values.temporal.address | quote }}}
- {name: KSQUAD_TEMPORAL_NAMESPACE, value: {{ .Values.temporal.namespace | quote }}}
- {name: KSQUAD_TEMPORAL_TLS, value: {{ .Values.temporal.tls | quote }}}
{{- if .Values.temporal.apiKeySecret.name }}
- name: KSQUAD_TEMPORAL_API_KEY
  valueFrom: {secretKeyRef: {name: {{ .Values.temporal.apiKeySecret.name }}, key: {{ .Values.temporal.apiKeySecret.key }}}}
{{- end }}
{{- with .Values.temporal.mtls }}
{{- if .secretName }}
- {name: KSQUAD_TEMPORAL_TLS_CERT_FILE, value: /var/run/ksquad/temporal-tls/tls.crt}
- {name: KSQUAD_TEMPORAL_TLS_KEY_FILE, value: /var/run/ksquad/temporal-tls/tls.key}
{{- if .caKey }}
- {name: KSQUAD_TEMPORAL_TLS_CA_FILE, value: /var/run/ksquad/temporal-tls/{{ .caKey }}}
{{- end }}
{{- if .serverName }}
- {name: KSQUAD_TEMPORAL_TLS_SERVER_NAME, value: {{ .serverName | quote }}}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- /* The bridge's and the worker's: Temporal's client certificate (mutual TLS), a kubernetes.io/tls Secret. */ -}}
{{- define "ksquad.temporalMount" -}}
{{- if .Values.temporal.mtls.secretName }}
- {name: temporal-tls, mountPath: /var/run/ksquad/temporal-tls, readOnly: true}
{{- end }}
{{- end -}}

{{- define "ksquad.temporalVolume" -}}
{{- if .Values.temporal.mtls.secretName }}
- name: temporal-tls
  secret: {secretName: {{ .Values.temporal.mtls.secretName }}, defaultMode: 0440}
{{- end }}
{{- end -}}

{{- define "ksquad.codecEnv" -}}
{{- if .Values.codec.keySecret.name }}
- {name: KSQUAD_CODEC_KEY_FILE, value: /var/run/ksquad/codec/{{ .Values.codec.keySecret.key }}}
- {name: KSQUAD_CODEC_KEYS, value: /var/run/ksquad/codec}
{{- end }}
{{- end -}}

{{- define "ksquad.sealSecretName" -}}
{{- .Values.seal.keySecret.name | default (printf "%s-seal-key" .Release.Name) -}}
{{- end -}}

{{- /* The bridge's and the worker's: the seal key (templates/seal.yaml). */ -}}
{{- define "ksquad.sealEnv" -}}
- {name: KSQUAD_SEAL_KEY_FILE, value: /var/run/ksquad/seal/{{ .Values.seal.keySecret.key }}}
{{- end -}}

{{- define "ksquad.sealMount" -}}
- {name: seal-key, mountPath: /var/run/ksquad/seal, readOnly: true}
{{- end -}}

{{- define "ksquad.sealVolume" -}}
- name: seal-key
  secret: {secretName: {{ include "ksquad.sealSecretName" . }}, defaultMode: 0440}
{{- end -}}

{{- /* Attempts' work item tokens (agent.callers.item_token): the worker signs them, ksquad-api checks them
       (templates/items.yaml). Only with the API: without it no attempt is given a way to its item. */ -}}
{{- define "ksquad.itemKeySecretName" -}}
{{- .Values.api.itemTokenKeySecret.name | default (printf "%s-item-token-key" .Release.Name) -}}
{{- end -}}

{{- define "ksquad.itemKeyEnv" -}}
{{- if .Values.api.enabled }}
- {name: KSQUAD_ITEM_TOKEN_KEY_FILE, value: /var/run/ksquad/item-token/{{ .Values.api.itemTokenKeySecret.key }}}
{{- end }}
{{- end -}}

{{- define "ksquad.itemKeyMount" -}}
{{- if .Values.api.enabled }}
- {name: item-token-key, mountPath: /var/run/ksquad/item-token, readOnly: true}
{{- end }}
{{- end -}}

{{- define "ksquad.itemKeyVolume" -}}
{{- if .Values.api.enabled }}
- name: item-token-key
  secret: {secretName: {{ include "ksquad.itemKeySecretName" . }}, defaultMode: 0440}
{{- end }}
{{- end -}}

{{- define "ksquad.consoleKeySecretName" -}}
{{- .Values.api.console.keySecret.name | default (printf "%s-console-key" .Release.Name) -}}
{{- end -}}

{{- /* Where attempts reach ksquad-api for their work items: api.itemsUrl, or the Service's cluster address on
       the listener for sandboxes. */ -}}
{{- define "ksquad.itemsUrl" -}}
{{- if .Values.api.itemsUrl -}}
{{- .Values.api.itemsUrl -}}
{{- else -}}
{{- printf "https://ksquad-api.%s.svc:%v" .Release.Namespace .Values.api.itemsPort -}}
{{- end -}}
{{- end -}}

{{- define "ksquad.itemsTlsSecretName" -}}
{{- .Values.api.itemsTlsSecret | default (printf "%s-items-tls" .Release.Name) -}}
{{- end -}}

{{- /* The names the items listener's certificate must hold, as JSON {"dns": [...], "ips": [...]}: the Service's
       names, its fixed clusterIP, and api.itemsUrl's host. */ -}}
{{- define "ksquad.itemsTlsNames" -}}
{{- $ns := .Release.Namespace -}}
{{- $dns := list "ksquad-api" (printf "ksquad-api.%s" $ns) (printf "ksquad-api.%s.svc" $ns) (printf "ksquad-api.%s.svc.cluster.local" $ns) -}}
{{- $ips := list -}}
{{- with .Values.api.service.clusterIP }}{{ $ips = append $ips . }}{{ end -}}
{{- with .Values.api.itemsUrl -}}
  {{- $host := (urlParse .).hostname -}}
  {{- if or (regexMatch "^[0-9.]+$" $host) (contains ":" $host) -}}
    {{- $ips = append $ips $host -}}
  {{- else if $host -}}
    {{- $dns = append $dns $host -}}
  {{- end -}}
{{- end -}}
{{- dict "dns" (uniq $dns) "ips" (uniq $ips) | toJson -}}
{{- end -}}

{{- define "ksquad.itemsCaEnv" -}}
{{- if .Values.api.enabled }}
- {name: KSQUAD_ITEM_API_CA_FILE, value: /var/run/ksquad/items-ca/ca.crt}
{{- end }}
{{- end -}}

{{- define "ksquad.itemsCaMount" -}}
{{- if .Values.api.enabled }}
- {name: items-ca, mountPath: /var/run/ksquad/items-ca, readOnly: true}
{{- end }}
{{- end -}}

{{- /* The CA alone: the worker never holds the listener's key. */ -}}
{{- define "ksquad.itemsCaVolume" -}}
{{- if .Values.api.enabled }}
- name: items-ca
  secret: {secretName: {{ include "ksquad.itemsTlsSecretName" . }}, defaultMode: 0440, items: [{key: ca.crt, path: ca.crt}]}
{{- end }}
{{- end -}}

{{- define "ksquad.codecMount" -}}
{{- if .Values.codec.keySecret.name }}
- {name: codec-key, mountPath: /var/run/ksquad/codec, readOnly: true}
{{- end }}
{{- end -}}

{{- define "ksquad.codecVolume" -}}
{{- if .Values.codec.keySecret.name }}
- name: codec-key
  secret: {secretName: {{ .Values.codec.keySecret.name }}, defaultMode: 0440}
{{- end }}
{{- end -}}


{{- /* The images a sandbox may run: the agent image, sandbox.allowedImages, and the skills' toolchains and sidecars. */ -}}
{{- define "ksquad.sandboxImages" -}}
{{- $images := list (include "ksquad.agentImage" .) -}}
{{- range .Values.sandbox.allowedImages }}{{ $images = append $images . }}{{ end -}}
{{- range $_, $c := .Values.sandbox.toolchains }}{{ $images = append $images $c.image }}{{ end -}}
{{- range $_, $c := .Values.sandbox.sidecars }}{{ $images = append $images $c.image }}{{ end -}}
{{- $images | uniq | toJson -}}
{{- end -}}

{{- /* The RuntimeClass objects the allowed runtime classes map to; "null" when one maps to the node's default. */ -}}
{{- define "ksquad.allowedRuntimeClassNames" -}}
{{- $names := list -}}
{{- range .Values.sandbox.allowedRuntimeClasses }}{{ $names = append $names (index $.Values.sandbox.runtimeClasses . | default "null") }}{{ end -}}
{{- $names | uniq | toJson -}}
{{- end -}}


{{- /* A warm pool's pod template, as the chart renders it: the pool's ReplicaSet gets it (pools.yaml), and so does
       the worker (sandbox-config.yaml), which claims only pods of this very template, never what a live ReplicaSet
       says its template is (docs/security.md). Called with (list $ pool). */ -}}
{{- /* A ksquad process's OpenTelemetry export (tracing/): nothing unless tracing.otlpEndpoint is set. Called with
(list $ "service-name"). */ -}}
{{- define "ksquad.tracingEnv" -}}
{{- $ := index . 0 -}}
{{- $service := index . 1 -}}
{{- with $.Values.tracing -}}
{{- if .otlpEndpoint }}
- {name: OTEL_EXPORTER_OTLP_ENDPOINT, value: {{ .otlpEndpoint | quote }}}
- {name: OTEL_EXPORTER_OTLP_PROTOCOL, value: http/protobuf}
- {name: OTEL_SERVICE_NAME, value: {{ $service }}}
- {name: OTEL_TRACES_SAMPLER, value: {{ .sampler | quote }}}
{{- with .samplerArg }}
- {name: OTEL_TRACES_SAMPLER_ARG, value: {{ . | quote }}}
{{- end }}
{{- if .recordContent }}
- {name: KSQUAD_TRACE_CONTENT, value: "true"}
{{- end }}
- {name: OTEL_INSTRUMENTATION_A2A_SDK_ENABLED, value: {{ .a2aSdkSpans | toString | quote }}}
{{- end }}
{{- end }}
{{- end -}}

{{- /* What a sandbox's agent exports its spans with (tracing.sandboxes), as a map: the cold Jobs' agents get it
through the worker's sandbox config, the warm pools' in their template. Never the exporter's headers. */ -}}
{{- define "ksquad.sandboxTracingEnv" -}}
{{- with .Values.tracing -}}
{{- if .sandboxes.enabled -}}
{{- $env := dict "OTEL_EXPORTER_OTLP_ENDPOINT" (.sandboxes.otlpEndpoint | default .otlpEndpoint) "OTEL_EXPORTER_OTLP_PROTOCOL" "http/protobuf" "OTEL_SERVICE_NAME" "ksquad-agent" "OTEL_TRACES_SAMPLER" .sampler "OTEL_INSTRUMENTATION_A2A_SDK_ENABLED" (.a2aSdkSpans | toString) -}}
{{- with .samplerArg }}{{ $_ := set $env "OTEL_TRACES_SAMPLER_ARG" . }}{{ end -}}
{{- if .recordContent }}{{ $_ := set $env "KSQUAD_TRACE_CONTENT" "true" }}{{ end -}}
{{- toJson $env -}}
{{- else -}}
{}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ksquad.poolTemplate" -}}
{{- $ := index . 0 -}}
{{- with index . 1 -}}
{{- $image := .image | default (include "ksquad.agentImage" $) }}
{{- $command := .command | default $.Values.sandbox.command }}
{{- $runtimeClass := .runtimeClass | default "gvisor" }}
{{- $runtimeClassName := index $.Values.sandbox.runtimeClasses $runtimeClass }}
{{- $placement := .placement | default dict }}
{{- $resources := $.Values.sandbox.resources }}
{{- with $placement.resources }}
{{- $resources = dict "requests" (merge (dict) (.requests | default dict) ($.Values.sandbox.resources.requests | default dict)) "limits" (merge (dict) (.limits | default dict) ($.Values.sandbox.resources.limits | default dict)) }}
{{- end }}
metadata:
  labels:
    app.kubernetes.io/component: sandbox
    ksquad.io/pool: {{ .name }}
    ksquad.io/state: warm
    ksquad.io/runtime-class: {{ $runtimeClass }}
spec:
  {{- /* placed as manifests.placement_fields places a cold Job's pod: the worker claims from a pool only
         for runs placed exactly so */}}
  serviceAccountName: {{ $placement.serviceAccountName | default $.Values.sandbox.serviceAccount }}
  {{- with $placement.nodeSelector }}
  nodeSelector: {{ toJson . }}
  {{- end }}
  {{- with $placement.tolerations }}
  tolerations: {{ toJson . }}
  {{- end }}
  {{- with $placement.affinity }}
  affinity: {{ toJson . }}
  {{- end }}
  {{- with $placement.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: 10
  {{- with $runtimeClassName }}
  runtimeClassName: {{ . }}
  {{- end }}
  securityContext:
    {{- include "ksquad.sandboxSecurityContext" $ | nindent 4 }}
  containers:
    - name: agent
      image: {{ $image }}
      command: {{ toJson $command }}
      args: ["--host", "$(POD_IP)", "--port", "{{ $.Values.sandbox.port }}"]
      env:
        - name: POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        - name: KSQUAD_SECRETS_DIR
          value: /var/run/ksquad/secrets
        - name: KSQUAD_POD_ANNOTATIONS
          value: /etc/ksquad/pod/annotations
        {{- range $name, $value := include "ksquad.sandboxTracingEnv" $ | fromJson }}
        - {name: {{ $name }}, value: {{ $value | quote }}}
        {{- end }}
      ports:
        - {name: a2a, containerPort: {{ $.Values.sandbox.port }}}
      readinessProbe:
        httpGet: {path: /readyz, port: a2a}
        periodSeconds: 1
      resources:
        {{- toYaml $resources | nindent 8 }}
      securityContext:
        {{- include "ksquad.containerSecurityContext" $ | nindent 8 }}
      volumeMounts:
        - {name: tmp, mountPath: /tmp}
        - {name: pod-info, mountPath: /etc/ksquad/pod, readOnly: true}
        {{- range .credentials }}
        - {name: credential-{{ . }}, mountPath: /var/run/ksquad/secrets/{{ . }}, readOnly: true}
        {{- end }}
  volumes:
    - {name: tmp, emptyDir: {}}
    - name: pod-info
      downwardAPI:
        items: [{path: annotations, fieldRef: {fieldPath: metadata.annotations}}]
    {{- range .credentials }}
    - name: credential-{{ . }}
      secret: {secretName: {{ . }}}
    {{- end }}
{{- end }}
{{- end -}}

{{- /* "true" when a pool's backend is agent-sandbox (its SandboxClaims are then the worker's to make), else "". */ -}}
{{- define "ksquad.agentSandboxPools" -}}
{{- range .Values.pools }}{{ if eq (.backend | default "replicaset") "agent-sandbox" }}true{{ end }}{{ end }}
{{- end }}
