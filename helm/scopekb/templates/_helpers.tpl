{{/*
Names, labels and the pieces every scopekb pod shares. Each workload template (http.yaml, workers.yaml,
beat.yaml, init-job.yaml) builds its pod from "scopekb.podSpec", so security context, volumes, image and
settings are written once.
*/}}

{{- define "scopekb.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "scopekb.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of one component's objects: "scopekb.componentName" (dict "root" $ "component" "query") */}}
{{- define "scopekb.componentName" -}}
{{- printf "%s-%s" (include "scopekb.fullname" .root | trunc 40 | trimSuffix "-") .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "scopekb.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "scopekb.selectorLabels" -}}
app.kubernetes.io/name: {{ include "scopekb.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "scopekb.labels" -}}
helm.sh/chart: {{ include "scopekb.chart" . }}
{{ include "scopekb.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: scopekb
{{- end -}}

{{/* Selector labels of one component (and worker pool): (dict "root" $ "component" "worker" "pool" "default") */}}
{{- define "scopekb.componentSelectorLabels" -}}
{{ include "scopekb.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- with .pool }}
scopekb.io/worker-pool: {{ . }}
{{- end }}
{{- end -}}

{{- define "scopekb.componentLabels" -}}
{{ include "scopekb.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- with .pool }}
scopekb.io/worker-pool: {{ . }}
{{- end }}
{{- end -}}

{{- define "scopekb.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "scopekb.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "scopekb.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{/* The Secret the pods read: an existing one, or the chart's own. */}}
{{- define "scopekb.secretName" -}}
{{- default (include "scopekb.componentName" (dict "root" . "component" "secrets")) .Values.secrets.existingSecret -}}
{{- end -}}

{{- define "scopekb.configMapName" -}}
{{- include "scopekb.componentName" (dict "root" . "component" "config") -}}
{{- end -}}

{{/* Plain settings that are set (empty values keep the application's defaults), as a dict. */}}
{{- define "scopekb.configData" -}}
{{- $out := dict -}}
{{- range $k, $v := .Values.config -}}
{{- if not (kindIs "invalid" $v) -}}
{{- $s := toString $v -}}
{{- if ne $s "" -}}{{- $_ := set $out $k $s -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* Secret settings the chart's own Secret holds (the non-empty values), plus the KEDA Redis password. */}}
{{- define "scopekb.secretData" -}}
{{- $out := dict -}}
{{- range $k, $v := .Values.secrets.values -}}
{{- if and (not (kindIs "invalid" $v)) (ne (toString $v) "") -}}{{- $_ := set $out $k (toString $v) -}}{{- end -}}
{{- end -}}
{{- $keda := include "scopekb.kedaRedis" . | fromJson -}}
{{- if $keda.passwordFromUrl -}}{{- $_ := set $out $keda.passwordKey $keda.passwordFromUrl -}}{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
Environment references to every secret setting (optional: a missing key leaves the application default).
"scopekb.secretEnv" (dict "root" $ "secretName" "...")
*/}}
{{- define "scopekb.secretEnv" -}}
{{- $secret := .secretName -}}
{{- range $k, $_ := .root.Values.secrets.values }}
- name: {{ $k }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $k }}
      optional: true
{{- end }}
{{- end -}}

{{/*
The Redis connection KEDA's scaler uses: from keda.redis, else parsed from the Redis URL in secrets.values.
Returns JSON: address, databaseIndex, enableTLS, passwordSecretName, passwordKey, passwordFromUrl.
*/}}
{{- define "scopekb.kedaRedis" -}}
{{- $k := .Values.keda.redis -}}
{{- $url := "" -}}
{{- if not .Values.secrets.existingSecret -}}{{- $url = toString (default "" .Values.secrets.values.SCOPEKB_REDIS__URL) -}}{{- end -}}
{{- $u := dict "host" "" "path" "" "scheme" "" "userinfo" "" -}}
{{- if $url -}}{{- $u = urlParse $url -}}{{- end -}}
{{- $address := $k.address -}}
{{- if and (not $address) $u.host -}}
{{- $address = ternary $u.host (printf "%s:6379" $u.host) (contains ":" $u.host) -}}
{{- end -}}
{{- $db := toString (default "" $k.databaseIndex) -}}
{{- if and (eq $db "") (ne (trimPrefix "/" $u.path) "") -}}{{- $db = trimPrefix "/" $u.path -}}{{- end -}}
{{- if eq $db "" -}}{{- $db = "0" -}}{{- end -}}
{{- $tls := $k.enableTLS -}}
{{- if kindIs "invalid" $tls -}}{{- $tls = eq $u.scheme "rediss" -}}{{- end -}}
{{- $pwFromUrl := "" -}}
{{- if and $u.userinfo (contains ":" $u.userinfo) -}}{{- $pwFromUrl = regexReplaceAll "^[^:]*:" $u.userinfo "" -}}{{- end -}}
{{- $secretName := $k.passwordSecret.name -}}
{{- $secretKey := $k.passwordSecret.key -}}
{{- if and (not $secretName) $pwFromUrl -}}
{{- $secretName = include "scopekb.secretName" . -}}
{{- $secretKey = "keda-redis-password" -}}
{{- else -}}
{{- $pwFromUrl = "" -}}
{{- end -}}
{{- dict "address" $address "databaseIndex" $db "enableTLS" $tls "passwordSecretName" $secretName "passwordKey" $secretKey "passwordFromUrl" $pwFromUrl | toJson -}}
{{- end -}}

{{/*
A worker pool: workerDefaults overlaid with the pool's own keys. "keda" and "pdb" merge key by key; every
other key (resources, probes, volumes, ...) replaces the default whole.
*/}}
{{- define "scopekb.workerPool" -}}
{{- $out := deepCopy .defaults -}}
{{- range $k, $v := .pool -}}
{{- if and (has $k (list "keda" "pdb")) (kindIs "map" $v) (kindIs "map" (get $out $k)) -}}
{{- $m := deepCopy (get $out $k) -}}
{{- range $k2, $v2 := $v }}{{ $_ := set $m $k2 $v2 }}{{ end -}}
{{- $_ := set $out $k $m -}}
{{- else -}}
{{- $_ := set $out $k $v -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* A PodDisruptionBudget body: "scopekb.pdbSpec" (dict "pdb" $pdb "selector" "...labels...") */}}
{{- define "scopekb.pdbSpec" -}}
{{- if not (kindIs "invalid" .pdb.minAvailable) }}
minAvailable: {{ .pdb.minAvailable }}
{{- else }}
maxUnavailable: {{ default 1 .pdb.maxUnavailable }}
{{- end }}
selector:
  matchLabels:
    {{- .selector | nindent 4 }}
{{- end -}}

{{/*
The pod spec shared by every scopekb workload.
"scopekb.podSpec" (dict "root" $ "c" $componentValues "name" "query" "args" (list ...) "ports" (list ...)
                        "probes" $probeDict "env" (list ...) "dataVolume" $volumeSource "workingDir" "/data"
                        "job" true|false "secretName" "...")
*/}}
{{- define "scopekb.podSpec" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $c := .c -}}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .job }}
serviceAccountName: {{ default (ternary "default" (include "scopekb.serviceAccountName" $root) $v.serviceAccount.create) $c.serviceAccountName }}
restartPolicy: Never
{{- else }}
serviceAccountName: {{ include "scopekb.serviceAccountName" $root }}
{{- end }}
automountServiceAccountToken: {{ $v.serviceAccount.automountToken }}
{{- with $v.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.terminationGracePeriodSeconds }}
terminationGracePeriodSeconds: {{ . }}
{{- end }}
{{- with (default $v.priorityClassName $c.priorityClassName) }}
priorityClassName: {{ . }}
{{- end }}
{{- with (default $v.nodeSelector $c.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (default $v.tolerations $c.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (default $v.affinity $c.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- tpl (toYaml .) $root | nindent 2 }}
{{- end }}
containers:
  - name: {{ .name }}
    image: {{ include "scopekb.image" $root }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    args:
      {{- toYaml .args | nindent 6 }}
    {{- with .workingDir }}
    workingDir: {{ . }}
    {{- end }}
    {{- with .ports }}
    ports:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- if not .job }}
    envFrom:
      - configMapRef:
          name: {{ include "scopekb.configMapName" $root }}
    {{- end }}
    env:
      {{- if .job }}
      {{- /* an inline setting that an env list below sets again is left out: a name listed twice is one the
             API server warns about and a patch may drop */}}
      {{- $later := dict }}
      {{- range (concat (default (list) .env) (default (list) $v.extraEnv) (default (list) $c.extraEnv)) }}
      {{- $_ := set $later .name true }}
      {{- end }}
      {{- range $k, $val := (include "scopekb.configData" $root | fromJson) }}
      {{- if not (hasKey $later $k) }}
      - name: {{ $k }}
        value: {{ $val | quote }}
      {{- end }}
      {{- end }}
      {{- end }}
      {{- include "scopekb.secretEnv" (dict "root" $root "secretName" .secretName) | trim | nindent 6 }}
      {{- with .env }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
      {{- with $v.extraEnv }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
      {{- with $c.extraEnv }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- range $probe := list "startupProbe" "livenessProbe" "readinessProbe" }}
    {{- with (get $c $probe) }}
    {{ $probe }}:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- end }}
    {{- with $c.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $v.securityContext }}
    securityContext:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    volumeMounts:
      - name: tmp
        mountPath: /tmp
      - name: data
        mountPath: /data
      {{- with $c.extraVolumeMounts }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
volumes:
  - name: tmp
    emptyDir:
      {{- toYaml $v.tmpVolume | nindent 6 }}
  - name: data
    {{- toYaml (default (dict "emptyDir" (dict "sizeLimit" "1Gi")) .dataVolume) | nindent 4 }}
  {{- with $c.extraVolumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* Pod template metadata: labels and annotations (checksums roll pods when settings change). */}}
{{- define "scopekb.podMetadata" -}}
{{- $v := .root.Values -}}
labels:
  {{- include "scopekb.componentLabels" (dict "root" .root "component" .component "pool" .pool) | nindent 2 }}
  {{- with $v.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- with .c.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  checksum/config: {{ include "scopekb.configData" .root | sha256sum }}
  {{- if not $v.secrets.existingSecret }}
  checksum/secrets: {{ include "scopekb.secretData" .root | sha256sum }}
  {{- end }}
  {{- with $v.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- with .c.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}
