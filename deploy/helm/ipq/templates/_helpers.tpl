{{/* The labels every object carries, as in deploy/kubernetes/. */}}
{{- define "ipq.labels" -}}
app.kubernetes.io/name: ipq
app.kubernetes.io/component: agent
{{- end }}

{{/* The image every container of the DaemonSet runs: the tag defaults to appVersion. */}}
{{- define "ipq.image" -}}
image: {{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/*
The agent's config as a map: `config`, then the chart's named values, then the host paths the
DaemonSet mounts. A key of `config` that a named value (or a mount) owns is refused, naming the
value to set instead, so that no setting is silently overridden.
*/}}
{{- define "ipq.agentConfigMap" -}}
{{- $owned := dict
  "mode" "mode" "on_early_reuse" "onEarlyReuse" "cooldown" "cooldown"
  "quiet_period" "quietPeriod" "max_cooldown" "maxCooldown" "capacity" "capacity"
  "ipam_on_exhausted" "ipam.onExhausted" "ipam_cni_bin_dirs" "ipam.cniBinDirs"
  "interfaces" "interfaces.workload and interfaces.uplink"
  "bpffs_dir" "nothing: the DaemonSet mounts /sys/fs/bpf"
  "state_dir" "nothing: the DaemonSet mounts /var/lib/ipq"
  "api_socket" "nothing: the DaemonSet mounts /run/ipq and install-cni names the socket"
  "api_peer_procfs" "nothing: the DaemonSet mounts the node's /proc at /host/proc" -}}
{{- range $key, $use := $owned }}
{{- if hasKey ($.Values.config | default dict) $key }}
{{- fail (printf "config.%s is set: set %s instead (docs/kubernetes.md)" $key $use) }}
{{- end }}
{{- end }}
{{- if not (has .Values.mode (list "enforce" "observe")) }}
{{- fail (printf "mode is %q: it is enforce or observe" (toString .Values.mode)) }}
{{- end }}
{{- $config := deepCopy (.Values.config | default dict) }}
{{- $_ := set $config "mode" .Values.mode }}
{{- $_ := set $config "on_early_reuse" .Values.onEarlyReuse }}
{{- $_ := set $config "cooldown" .Values.cooldown }}
{{- $_ := set $config "quiet_period" .Values.quietPeriod }}
{{- $_ := set $config "max_cooldown" .Values.maxCooldown }}
{{- $_ := set $config "capacity" .Values.capacity }}
{{- $_ := set $config "ipam_on_exhausted" .Values.ipam.onExhausted }}
{{- $_ := set $config "ipam_cni_bin_dirs" .Values.ipam.cniBinDirs }}
{{- $_ := set $config "interfaces" (dict "workload" .Values.interfaces.workload "uplink" .Values.interfaces.uplink) }}
{{- $_ := set $config "bpffs_dir" "/sys/fs/bpf/ipq" }}
{{- $_ := set $config "state_dir" "/var/lib/ipq" }}
{{- $_ := set $config "api_socket" "/run/ipq/ipq.sock" }}
{{- $_ := set $config "api_peer_procfs" "/host/proc" }}
{{- if .Values.whereabouts.enabled }}
{{- $kubernetes := get $config "kubernetes" | default dict }}
{{- if hasKey $kubernetes "whereabouts" }}
{{- fail "config.kubernetes.whereabouts is set: set whereabouts.enabled instead" }}
{{- end }}
{{- $_ := set $kubernetes "whereabouts" true }}
{{- if ne .Values.whereabouts.namespace "kube-system" }}
{{- $_ := set $kubernetes "whereabouts_namespace" .Values.whereabouts.namespace }}
{{- end }}
{{- $_ := set $config "kubernetes" $kubernetes }}
{{- end }}
{{- toJson $config }}
{{- end }}

{{/* The agent's agent.toml. */}}
{{- define "ipq.agentToml" -}}
# Rendered by ipq's Helm chart from its values (docs/kubernetes.md); every key is in docs/config.md.
{{ include "ipq.toml" (dict "table" (include "ipq.agentConfigMap" . | fromJson) "prefix" "") }}
{{- end }}

{{/*
A map as TOML: its scalars and arrays as `key = value` (JSON's spelling of strings, numbers,
booleans and arrays is TOML's too; numbers read from values are floats, and JSON prints a whole
one without a fraction, as the agent's integer keys need), then its maps as [tables].
*/}}
{{- define "ipq.toml" -}}
{{- $prefix := .prefix }}
{{- range $key, $value := .table }}
{{- if not (kindIs "map" $value) }}
{{- if kindIs "invalid" $value }}
{{- fail (printf "config.%s%s is null: remove it or give it a value" $prefix $key) }}
{{- end }}
{{ include "ipq.tomlKey" $key }} = {{ toJson $value }}
{{- end }}
{{- end }}
{{- range $key, $value := .table }}
{{- if kindIs "map" $value }}
{{- $name := printf "%s%s" $prefix (include "ipq.tomlKey" $key) }}

[{{ $name }}]
{{- include "ipq.toml" (dict "table" $value "prefix" (printf "%s." $name)) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ipq.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}
