{{- define "ksquad.workerUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:ksquad-worker
{{- end -}}

{{- /* A sandbox's containers by name, one field each, as a CEL map (JSON is CEL): the agent and the configured
       toolchains and sidecars, as job_manifest (activities/sandboxes/manifests.py) names and fills them. */ -}}
{{- define "ksquad.sandboxContainers" -}}
{{- $ := index . 0 -}}
{{- $field := index . 1 -}}
{{- $agentImages := list (include "ksquad.agentImage" $) -}}
{{- range $.Values.sandbox.allowedImages }}{{ $agentImages = append $agentImages . }}{{ end -}}
{{- $toolchains := "/opt/ksquad/toolchains" -}}
{{- $agentEnv := dict "KSQUAD_TOOLCHAINS_DIR" $toolchains "KSQUAD_SECRETS_DIR" "/var/run/ksquad/secrets"
      "KSQUAD_POD_ANNOTATIONS" "/etc/ksquad/pod/annotations" -}}
{{- range $k, $v := (include "ksquad.sandboxTracingEnv" $ | fromJson) }}{{ $_ := set $agentEnv $k $v }}{{ end -}}
{{- $shapes := dict "agent" (dict
      "images" ($agentImages | uniq)
      "command" $.Values.sandbox.command
      "args" (list "--host" "$(POD_IP)" "--port" (toString $.Values.sandbox.port))
      "env" $agentEnv) -}}
{{- range $name, $c := $.Values.sandbox.toolchains -}}
{{- $env := dict "KSQUAD_TOOLCHAIN_DIR" (printf "%s/%s" $toolchains $name) -}}
{{- range $k, $v := ($c.env | default dict) }}{{ $_ := set $env $k (toString $v) }}{{ end -}}
{{- $_ := set $shapes (printf "toolchain-%s" (include "ksquad.dns" $name)) (dict "images" (list $c.image)
      "command" ($c.command | default list) "args" ($c.args | default list) "env" $env) -}}
{{- end -}}
{{- range $name, $c := $.Values.sandbox.sidecars -}}
{{- $env := dict -}}
{{- range $k, $v := ($c.env | default dict) }}{{ $_ := set $env $k (toString $v) }}{{ end -}}
{{- $_ := set $shapes (printf "sidecar-%s" (include "ksquad.dns" $name)) (dict "images" (list $c.image)
      "command" ($c.command | default list) "args" ($c.args | default list) "env" $env) -}}
{{- end -}}
{{- $out := dict -}}
{{- range $name, $shape := $shapes }}{{ $_ := set $out $name (index $shape $field) }}{{ end -}}
{{- $out | toJson -}}
{{- end -}}

{{- /* activities/sandboxes/manifests.py _dns: a container name from a toolchain's or sidecar's name. */ -}}
{{- define "ksquad.dns" -}}
{{- regexReplaceAll "[^a-z0-9-]" (lower .) "-" | trimAll "-" | trunc 40 | default "x" -}}
{{- end -}}

{{- /* Per container of list (args: root, CEL list, path): the securityContext fields a sandbox refuses, as paths. */ -}}
{{- define "ksquad.celContainerSecurity" -}}
{{- $user := (index . 0).Values.sandbox.runAsUser -}}
{{- $p := printf "'%s[' + c.name + '].securityContext" (index . 2) -}}
{{ index . 1 }}.map(c, !has(c.securityContext) ? [{{ $p }}'] :
(has(c.securityContext.runAsUser) && c.securityContext.runAsUser != {{ $user }} ? [{{ $p }}.runAsUser'] : []) +
(has(c.securityContext.runAsNonRoot) && !c.securityContext.runAsNonRoot ? [{{ $p }}.runAsNonRoot'] : []) +
(has(c.securityContext.runAsGroup) && c.securityContext.runAsGroup != {{ $user }} ? [{{ $p }}.runAsGroup'] : []) +
(has(c.securityContext.privileged) && c.securityContext.privileged ? [{{ $p }}.privileged'] : []) +
(has(c.securityContext.allowPrivilegeEscalation) && !c.securityContext.allowPrivilegeEscalation ?
  [] : [{{ $p }}.allowPrivilegeEscalation']) +
(has(c.securityContext.capabilities) && has(c.securityContext.capabilities.drop) &&
  'ALL' in c.securityContext.capabilities.drop ? [] : [{{ $p }}.capabilities.drop']) +
(has(c.securityContext.capabilities) && has(c.securityContext.capabilities.add) &&
  size(c.securityContext.capabilities.add) > 0 ? [{{ $p }}.capabilities.add'] : []) +
(has(c.securityContext.readOnlyRootFilesystem) && c.securityContext.readOnlyRootFilesystem ?
  [] : [{{ $p }}.readOnlyRootFilesystem']) +
(has(c.securityContext.procMount) && c.securityContext.procMount != 'Default' ? [{{ $p }}.procMount'] : []) +
(has(c.securityContext.seccompProfile) && c.securityContext.seccompProfile.type != 'RuntimeDefault' ?
  [{{ $p }}.seccompProfile'] : []) +
(has(c.securityContext.appArmorProfile) && c.securityContext.appArmorProfile.type != 'RuntimeDefault' ?
  [{{ $p }}.appArmorProfile'] : []) +
(has(c.securityContext.seLinuxOptions) ? [{{ $p }}.seLinuxOptions'] : []) +
(has(c.securityContext.windowsOptions) ? [{{ $p }}.windowsOptions'] : []))
{{- end -}}

{{- /* Per container: env entries other than ksquad's (args: CEL list, path). A credential is
       KSQUAD_CREDENTIAL_<SECRET>_<KEY> (workflows.contract.CredentialRef.env) from a secretKeyRef to a Secret the
       pod mounts as a credential volume; POD_IP comes from status.podIP; the rest are the chart's literals. */ -}}
{{- define "ksquad.celContainerEnv" -}}
{{- $p := printf "'%s[' + c.name + ']" (index . 1) -}}
{{ index . 0 }}.map(c, (has(c.envFrom) ? [{{ $p }}.envFrom'] : []) + (!has(c.env) ? [] : c.env.filter(e,
  !(has(e.valueFrom) ?
    c.name == 'agent' && (
      (e.name == 'POD_IP' && has(e.valueFrom.fieldRef) && e.valueFrom.fieldRef.fieldPath == 'status.podIP') ||
      (has(e.valueFrom.secretKeyRef) && has(e.valueFrom.secretKeyRef.name) &&
       e.valueFrom.secretKeyRef.name in variables.credentialSecrets &&
       e.name == 'KSQUAD_CREDENTIAL_' + (e.valueFrom.secretKeyRef.name + '_' + e.valueFrom.secretKeyRef.key)
         .upperAscii().replace('-', '_').replace('.', '_'))) :
    c.name in variables.env && e.name in variables.env[c.name] &&
    (has(e.value) ? e.value : '') == variables.env[c.name][e.name])
  ).map(e, {{ $p }}.env[' + e.name + ']')))
{{- end -}}

{{- /* Per container: what it runs (command, args) and what the kubelet does in or for it (probes, hooks). */ -}}
{{- define "ksquad.celContainerRuns" -}}
{{- $p := printf "'%s[' + c.name + ']" (index . 1) -}}
{{ index . 0 }}.map(c,
(c.name in variables.commands && (has(c.command) ? c.command : []) != variables.commands[c.name] ?
  [{{ $p }}.command'] : []) +
(c.name in variables.args && (has(c.args) ? c.args : []) != variables.args[c.name] ? [{{ $p }}.args'] : []) +
{{- range $probe := list "livenessProbe" "readinessProbe" "startupProbe" }}
(has(c.{{ $probe }}) && has(c.{{ $probe }}.exec) ? [{{ $p }}.{{ $probe }}.exec'] : []) +
(has(c.{{ $probe }}) && has(c.{{ $probe }}.httpGet) && has(c.{{ $probe }}.httpGet.host) ?
  [{{ $p }}.{{ $probe }}.httpGet.host'] : []) +
(has(c.{{ $probe }}) && has(c.{{ $probe }}.tcpSocket) && has(c.{{ $probe }}.tcpSocket.host) ?
  [{{ $p }}.{{ $probe }}.tcpSocket.host'] : []) +
{{- end }}
(has(c.lifecycle) ? [{{ $p }}.lifecycle'] : []))
{{- end -}}

{{- /* Per container: mounts (a credential volume read-only at its own path under /var/run/ksquad/secrets, nothing
       else there), devices, host ports, the termination message path (which the kubelet copies into status). */ -}}
{{- define "ksquad.celContainerMounts" -}}
{{- $p := printf "'%s[' + c.name + ']" (index . 1) -}}
{{ index . 0 }}.map(c,
(!has(c.volumeMounts) ? [] : c.volumeMounts.filter(m, !(variables.credentialVolumes.exists(v, v.name == m.name) ?
  variables.credentialVolumes.exists(v, v.name == m.name && has(v.secret.secretName) &&
    m.mountPath == '/var/run/ksquad/secrets/' + v.secret.secretName) &&
  has(m.readOnly) && m.readOnly && !has(m.subPath) && !has(m.subPathExpr) :
  !m.mountPath.startsWith('/var/run/ksquad/secrets'))).map(m, {{ $p }}.volumeMounts[' + m.name + ']')) +
(has(c.volumeDevices) ? [{{ $p }}.volumeDevices'] : []) +
(!has(c.ports) ? [] : c.ports.filter(p, has(p.hostPort) || has(p.hostIP)).map(p, {{ $p }}.ports[' +
  string(p.containerPort) + '].hostPort')) +
(has(c.terminationMessagePath) && c.terminationMessagePath != '/dev/termination-log' ?
  [{{ $p }}.terminationMessagePath'] : []))
{{- end -}}
