# af_events: structured playbook events for the rte runner.
#
# Embedded in the rte binary (package jobs/afevents), which installs it into a plugin directory
# at start; tested with ansible-core 2.14 (Debian 12). The event names and event_data fields
# follow ansible-runner's so that existing UIs can read them; the transport is our own: one line
# of compact JSON per event on the file descriptor named by AF_EVENTS_FD, never on stdout.
#
# Contract with the Go side (keep in step with afevents.go):
#   - AF_EVENTS_FD unset or empty: the plugin disables itself and costs nothing.
#   - each event is one line, written whole with os.write, counter 1, 2, 3... in write order.
#   - a payload value (res, item, diff, ...) whose JSON is over MAX_RES_BYTES becomes
#     {"_af_truncated": true, "original_bytes": N, "preview": "<first PREVIEW_BYTES of JSON>"}.
#   - no line is longer than MAX_LINE_BYTES (the newline included).
#   - a failure inside the plugin never fails the playbook: it becomes a "warning" event.
#   - each event carries ansible-runner's stdout, start_line, end_line, runner_ident and pid:
#     the text ansible displayed since the previous event (the stdout callback runs before this
#     plugin for the same call, so that is the event's own display text) and its line range
#     [start_line, end_line) counted from the first line displayed after this plugin loaded.
#     stdout over MAX_RES_BYTES is cut to its first MAX_RES_BYTES; the range still counts all.

import codecs
import datetime
import json
import math
import os
import select
import stat
import threading
import time
import uuid
from collections.abc import Mapping

from ansible import constants as C
from ansible.plugins.callback import CallbackBase
from ansible.utils.color import stringc

DOCUMENTATION = '''
    name: af_events
    type: notification
    short_description: structured playbook events for the rte runner
    description:
      - Writes one line of JSON per playbook event to the file descriptor named by the
        AF_EVENTS_FD environment variable, with ansible-runner's event names and fields.
      - Does nothing when AF_EVENTS_FD is not set.
      - Results of no_log tasks are censored; payloads over 64 KiB are replaced by a marker.
    requirements:
      - AF_EVENTS_FD names an open, writable file descriptor (a pipe from the rte runner)
'''

ENV_FD = 'AF_EVENTS_FD'
# The rte runner names the job in every process of it; it is the events' runner_ident.
ENV_JOB_ID = 'AF_JOB_ID'
MAX_RES_BYTES = 65536
MAX_LINE_BYTES = 4194304
PREVIEW_BYTES = 4096
MAX_DEPTH = 64
CENSORED = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"

# Keys of playbook_on_stats that must reach the app whole: they are counts per host, small per
# entry, and a UI that shows a cut recap would be wrong. Everything else is a payload.
_STATS_KEYS = frozenset(('ok', 'changed', 'failures', 'dark', 'skipped', 'rescued', 'ignored', 'processed'))


# Ansible carries undecodable output bytes as lone surrogates (surrogateescape); UTF-8 cannot
# hold them, so each becomes U+FFFD, which is what a Go or browser reader would show anyway.
_SURROGATE_HANDLER = 'af_events_replace'
# (The UTF-8 encoder accepts only ASCII text from a handler, so it returns the bytes of U+FFFD.)
codecs.register_error(_SURROGATE_HANDLER, lambda err: (b'\xef\xbf\xbd' * (err.end - err.start), err.end))


def _now():
    ns = time.time_ns()
    secs, frac = divmod(ns, 1000000000)
    return time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(secs)) + '.%09dZ' % frac


def _json_key(key):
    if isinstance(key, str):
        return str(key)
    if key is None:
        return 'null'
    if isinstance(key, bool):
        return 'true' if key else 'false'
    if isinstance(key, (int, float)):
        return repr(key)
    return str(_plain(key))


def _plain(value, depth=0):
    """Return value as plain JSON types: what json.dumps can always encode.

    Ansible hands callbacks its own types (AnsibleUnsafeText, vaulted strings, HostVars-like
    mappings), action plugins may return bytes, sets or datetimes, and float('nan') would make
    json.dumps write invalid JSON. A mapping flagged _ansible_no_log at any depth is censored
    here, so loop item results inside "results" are covered as well as the top level.
    """
    if value is None or isinstance(value, bool):
        return value
    # A vaulted string is a Sequence whose str() decrypts it: keep the ciphertext, as ansible's
    # own JSON encoder does, and never iterate it.
    if getattr(value, 'yaml_tag', None) == '!vault' or hasattr(value, '_ciphertext'):
        text = getattr(value, '_ciphertext', b'')
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode('utf-8', 'replace')
        return {'__ansible_vault': str(text)}
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode('utf-8', 'replace')
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if depth >= MAX_DEPTH:
        return '<af_events: nested deeper than %d levels>' % MAX_DEPTH
    if isinstance(value, Mapping):
        if value.get('_ansible_no_log'):
            return {'censored': CENSORED}
        return dict((_json_key(k), _plain(v, depth + 1)) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v, depth + 1) for v in value]
    try:
        return str(value)
    except Exception:
        return '<af_events: unprintable %s>' % type(value).__name__


def _dumps(value):
    """Encode plain value as compact UTF-8 JSON.

    ensure_ascii=False keeps non-ASCII text at its UTF-8 size instead of six bytes a character.
    """
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(',', ':'))
    return text.encode('utf-8', _SURROGATE_HANDLER)


def _truncated(encoded):
    preview = encoded[:PREVIEW_BYTES].decode('utf-8', 'ignore')
    return _dumps({'_af_truncated': True, 'original_bytes': len(encoded), 'preview': preview})


def _censor_result(result):
    """Return the result dict for an event, censored when its task had no_log.

    TaskQueueManager already hands callbacks a censored clean copy, but a copy keeps "changed",
    "attempts" and "retries"; the event carries "changed" separately, so the censored res holds
    nothing but the notice. Per-item no_log inside "results" is handled by _plain.
    """
    res = _res_of(result)
    task = _task_of(result)
    if not isinstance(res, Mapping):
        return res
    if res.get('_ansible_no_log') or (task is not None and getattr(task, 'no_log', False) is True):
        return {'censored': CENSORED}
    facts = res.get('ansible_facts')
    if isinstance(facts, Mapping) and 'ansible_env' in facts:
        # The controller's or host's environment often holds tokens; ansible-runner drops it too.
        res = dict(res)
        res['ansible_facts'] = dict((k, v) for k, v in facts.items() if k != 'ansible_env')
    return res


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'notification'
    CALLBACK_NAME = 'af_events'
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super(CallbackModule, self).__init__(*args, **kwargs)
        # Callbacks run on the main thread and, for events that workers send (runner_on_start,
        # item results, retries), on the strategy's results thread: one lock orders counters
        # and writes. It is reentrant because a write error reports through display.warning,
        # which this plugin also hooks.
        self._lock = threading.RLock()
        self._fd = None
        self._pid = os.getpid()
        self._counter = 0
        self._seen_messages = set()
        self._starts = {}
        self._play_repeats = {}
        self._task_repeats = {}
        self._task_event_uuid = {}
        self._playbook = None
        self._playbook_uuid = None
        self._play = None
        self._play_event_uuid = None
        self._task = None
        self._ident = os.environ.get(ENV_JOB_ID, '')
        # Text displayed since the last event and the lines displayed before it. Both are
        # guarded by the display's own lock, which also orders the writes to stdout.
        self._shown = []
        self._lines = 0

        raw = os.environ.pop(ENV_FD, '')
        if not raw:
            self.disabled = True
            return
        fd = self._open_channel(raw)
        if fd is None:
            self.disabled = True
            return
        self._fd = fd
        self._hook_display()

    # ---- channel -------------------------------------------------------------------------

    def _open_channel(self, raw):
        # The variable is removed from the environment above so a nested ansible-playbook (a
        # shell task on a local connection) cannot mistake its own fd with this number for the
        # channel; the fd is made close-on-exec for the same reason.
        try:
            fd = int(raw)
            if fd < 3:
                raise ValueError('fds 0-2 are stdin, stdout and stderr')
            mode = os.fstat(fd).st_mode
            if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISREG(mode)):
                raise ValueError('not a pipe, socket or regular file')
            os.set_inheritable(fd, False)
            return fd
        except (ValueError, OSError) as e:
            self._display.warning('af_events: %s=%r is not a usable events channel (%s); '
                                  'structured events are off for this run' % (ENV_FD, raw[:32], e))
            return None

    def _write(self, data):
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._fd, view)
            except BlockingIOError:
                # A reader that left the pipe non-blocking: wait for room instead of dropping.
                select.select([], [self._fd], [])
                continue
            view = view[n:]

    def _emit(self, event, event_data, event_uuid=None, parent_uuid=None):
        """Write one event line; never raises."""
        # Forked workers inherit the hooked display: a line from them would repeat counters.
        if self._fd is None or os.getpid() != self._pid:
            return
        with self._lock:
            if self._fd is None:
                return
            counter = self._counter + 1
            shown = self._take_shown()
            try:
                try:
                    line = self._line(counter, event, event_data, event_uuid, parent_uuid, shown)
                except Exception as e:
                    line = self._line(counter, 'warning', {
                        'message': 'af_events: cannot encode %s event: %s' % (event, _bounded_text(e)),
                        'source': 'af_events',
                    }, None, parent_uuid, shown)
            except Exception:
                return
            self._counter = counter
            try:
                self._write(line)
            except OSError as e:
                # The reader is gone (EPIPE) or the fd was closed: the playbook goes on, events
                # stop. Ansible's own display still shows everything.
                self._fd = None
                self._display.warning('af_events: events channel failed (%s); structured events are off '
                                      'for the rest of this run' % e)

    def _take_shown(self):
        """Return the text displayed since the last event and its line range."""
        with self._display._lock:
            text = ''.join(self._shown)
            self._shown = []
            start = self._lines
            self._lines += text.count('\n')
            return text, start, self._lines

    def _line(self, counter, event, event_data, event_uuid, parent_uuid, shown):
        text, start, end = shown
        shown = _dumps(text)
        if len(shown) > MAX_RES_BYTES:
            # Six bytes a character at most (a \u escape), so the cut fits.
            shown = _dumps(text[:MAX_RES_BYTES // 6])
        head = _dumps({
            'event': event,
            'uuid': event_uuid or str(uuid.uuid4()),
            'parent_uuid': parent_uuid or '',
            'counter': counter,
            'created': _now(),
            'start_line': start,
            'end_line': end,
            'runner_ident': self._ident,
            'pid': self._pid,
        })
        head = head[:-1] + b',"stdout":' + shown + b'}'
        parts = []
        for key, value in event_data.items():
            encoded = _dumps(_plain(value))
            if len(encoded) > MAX_RES_BYTES and key not in _STATS_KEYS:
                encoded = _truncated(encoded)
            parts.append([_dumps(str(key)), encoded])
        # head is '{...}': drop its closing brace and append "event_data".
        size = len(head) + len(',"event_data":{}}\n') + sum(len(k) + len(v) + 2 for k, v in parts)
        # Only stats dicts for tens of thousands of hosts get here: cut the largest values first.
        for part in sorted(parts, key=lambda p: len(p[1]), reverse=True):
            if size <= MAX_LINE_BYTES:
                break
            before = len(part[1])
            part[1] = _truncated(part[1])
            size -= before - len(part[1])
        body = b','.join(k + b':' + v for k, v in parts)
        return head[:-1] + b',"event_data":{' + body + b'}}\n'

    # ---- warnings and deprecations --------------------------------------------------------

    def _hook_display(self):
        # Ansible 2.14 has no callback hook for warnings: wrap the shared Display's methods on
        # the instance (not the class) so that only this process is affected, and always call
        # the original so stderr is unchanged. Only the message is taken from the call, so a
        # later ansible-core with more parameters still works.
        display = self._display
        original_display = display.display
        original_warning = display.warning
        original_deprecated = display.deprecated

        def display_text(msg, *args, **kwargs):
            # Noted and written under the display's lock, so the order of the noted text is
            # the order on stdout. Never take self._lock here: _emit takes it before this one.
            with display._lock:
                try:
                    self._note_shown(msg, *args, **kwargs)
                except Exception:
                    pass
                return original_display(msg, *args, **kwargs)

        def warning(*args, **kwargs):
            # Shown first, so the warning's text is in its own event's stdout.
            result = original_warning(*args, **kwargs)
            try:
                msg = args[0] if args else kwargs.get('msg', '')
                self._on_display('warning', {'message': msg})
            except Exception:
                pass
            return result

        def deprecated(*args, **kwargs):
            result = original_deprecated(*args, **kwargs)
            try:
                if kwargs.get('removed') or getattr(C, 'DEPRECATION_WARNINGS', True):
                    data = {'message': args[0] if args else kwargs.get('msg', '')}
                    for key in ('version', 'date', 'collection_name'):
                        if kwargs.get(key) is not None:
                            data[key] = kwargs[key]
                    self._on_display('deprecated', data)
            except Exception:
                pass
            return result

        display.display = display_text
        display.warning = warning
        display.deprecated = deprecated

    def _note_shown(self, msg, color=None, stderr=False, screen_only=False, log_only=False, newline=True):
        """Note the text Display.display is about to write, exactly as it writes it."""
        # A forked worker's display goes through a queue to this process, which shows it.
        if log_only or self._display._final_q or os.getpid() != self._pid:
            return
        text = msg[:-1] if msg.endswith('\n') else msg
        if color:
            text = stringc(text, color)
        if msg.endswith('\n') or newline:
            text += '\n'
        self._shown.append(text)

    def _on_display(self, event, data):
        # Ansible shows a repeated warning once; so do we.
        key = (event, str(data.get('message')))
        with self._lock:
            if key in self._seen_messages:
                return
            self._seen_messages.add(key)
        self._emit(event, self._context(data), parent_uuid=self._current_parent())

    # ---- context --------------------------------------------------------------------------

    def _context(self, data, task=None):
        ctx = {}
        if self._playbook_uuid:
            ctx['playbook'] = self._playbook
            ctx['playbook_uuid'] = self._playbook_uuid
        play = self._play
        if play is not None:
            ctx['play'] = play[0]
            ctx['play_uuid'] = play[1]
            ctx['play_pattern'] = play[2]
        task = task if task is not None else self._task
        if task is not None:
            ctx.update(_task_fields(task))
        ctx.update(data)
        return ctx

    def _current_parent(self):
        if self._task is not None:
            return self._task_event_uuid.get(str(self._task._uuid))
        return self._play_event_uuid or self._playbook_uuid

    def _task_parent(self, task):
        key = str(getattr(task, '_uuid', ''))
        return self._task_event_uuid.get(key) or key or self._play_event_uuid

    def _repeat_uuid(self, counts, base):
        # A play repeats per serial batch, a task per batch or per host under the free strategy,
        # a handler per flush. The first start keeps ansible's uuid; repeats get a suffix (as
        # ansible-runner does) so every event uuid is unique and children point at the start
        # they belong to.
        n = counts.get(base, 0) + 1
        counts[base] = n
        return base if n == 1 else '%s_%d' % (base, n)

    def _host_result_data(self, result, with_timing):
        host = _host_of(result)
        data = {
            'host': host.get_name(),
            'remote_addr': _remote_addr(host),
            'res': _censor_result(result),
        }
        if with_timing:
            start = self._starts.pop((data['host'], str(_task_of(result)._uuid)), None)
            if start is not None:
                data['start'] = start[0]
                data['end'] = _now()
                data['duration'] = time.monotonic() - start[1]
            else:
                data['start'] = data['end'] = data['duration'] = None
            data['event_loop'] = getattr(_task_of(result), 'loop_with', None)
        return data

    def _runner_event(self, event, result, extra=None, with_timing=True):
        data = self._host_result_data(result, with_timing)
        if extra:
            data.update(extra)
        task = _task_of(result)
        self._emit(event, self._context(data, task=task), parent_uuid=self._task_parent(task))

    def _item_event(self, event, result):
        res = _censor_result(result)
        item = None
        if isinstance(res, Mapping) and 'censored' not in res:
            loop_var = res.get('ansible_loop_var', 'item')
            item = res.get(loop_var, res.get('item'))
        extra = {'item': item}
        if event == 'runner_item_on_ok':
            extra['changed'] = _changed(result)
        self._runner_event(event, result, extra, with_timing=False)

    def _report(self, method, err):
        self._emit('warning', self._context({
            'message': 'af_events: %s failed: %s: %s' % (method, type(err).__name__, _bounded_text(err)),
            'source': 'af_events',
        }), parent_uuid=self._current_parent())

    # ---- ansible callbacks ----------------------------------------------------------------
    # Every method body runs under _guard: an exception here would only make ansible print a
    # warning, but it would also lose the event silently; _guard reports it as an event.

    def v2_playbook_on_start(self, playbook):
        with _guard(self, 'v2_playbook_on_start'):
            self._playbook = str(getattr(playbook, '_file_name', '') or '')
            self._playbook_uuid = str(uuid.uuid4())
            self._play = None
            self._play_event_uuid = None
            self._task = None
            self._emit('playbook_on_start', self._context({}), event_uuid=self._playbook_uuid)

    def v2_playbook_on_play_start(self, play):
        with _guard(self, 'v2_playbook_on_play_start'):
            hosts = getattr(play, 'hosts', '')
            pattern = ','.join(str(h) for h in hosts) if isinstance(hosts, (list, tuple)) else str(hosts or '')
            name = str(play.get_name() or '').strip() or pattern
            play_uuid = str(play._uuid)
            self._play = (name, play_uuid, pattern)
            self._task = None
            self._play_event_uuid = self._repeat_uuid(self._play_repeats, play_uuid)
            self._emit('playbook_on_play_start', self._context({'name': name, 'pattern': pattern}),
                       event_uuid=self._play_event_uuid, parent_uuid=self._playbook_uuid)

    def _task_start(self, event, task, is_conditional):
        self._task = task
        task_uuid = str(task._uuid)
        event_uuid = self._repeat_uuid(self._task_repeats, task_uuid)
        self._task_event_uuid[task_uuid] = event_uuid
        self._emit(event, self._context({'name': task.get_name(), 'is_conditional': bool(is_conditional)}),
                   event_uuid=event_uuid, parent_uuid=self._play_event_uuid)

    def v2_playbook_on_task_start(self, task, is_conditional):
        with _guard(self, 'v2_playbook_on_task_start'):
            self._task_start('playbook_on_task_start', task, is_conditional)

    def v2_playbook_on_cleanup_task_start(self, task):
        with _guard(self, 'v2_playbook_on_cleanup_task_start'):
            self._task_start('playbook_on_task_start', task, True)

    def v2_playbook_on_handler_task_start(self, task):
        with _guard(self, 'v2_playbook_on_handler_task_start'):
            self._task_start('playbook_on_handler_task_start', task, True)

    def v2_runner_on_start(self, host, task):
        with _guard(self, 'v2_runner_on_start'):
            name = host.get_name()
            self._starts[(name, str(task._uuid))] = (_now(), time.monotonic())
            data = {'host': name, 'remote_addr': _remote_addr(host)}
            self._emit('runner_on_start', self._context(data, task=task), parent_uuid=self._task_parent(task))

    def v2_runner_on_ok(self, result):
        with _guard(self, 'v2_runner_on_ok'):
            self._runner_event('runner_on_ok', result, {'changed': _changed(result)})

    def v2_runner_on_failed(self, result, ignore_errors=False):
        with _guard(self, 'v2_runner_on_failed'):
            self._runner_event('runner_on_failed', result, {'changed': _changed(result), 'ignore_errors': bool(ignore_errors)})

    def v2_runner_on_skipped(self, result):
        with _guard(self, 'v2_runner_on_skipped'):
            self._runner_event('runner_on_skipped', result, {'changed': False})

    def v2_runner_on_unreachable(self, result):
        with _guard(self, 'v2_runner_on_unreachable'):
            self._runner_event('runner_on_unreachable', result, {'changed': False})

    def v2_runner_item_on_ok(self, result):
        with _guard(self, 'v2_runner_item_on_ok'):
            self._item_event('runner_item_on_ok', result)

    def v2_runner_item_on_failed(self, result):
        with _guard(self, 'v2_runner_item_on_failed'):
            self._item_event('runner_item_on_failed', result)

    def v2_runner_item_on_skipped(self, result):
        with _guard(self, 'v2_runner_item_on_skipped'):
            self._item_event('runner_item_on_skipped', result)

    def v2_runner_retry(self, result):
        with _guard(self, 'v2_runner_retry'):
            self._runner_event('runner_retry', result, with_timing=False)

    def _async_event(self, event, result):
        res = _res_of(result) or {}
        jid = res.get('ansible_job_id') or (res.get('async_result') or {}).get('ansible_job_id')
        self._runner_event(event, result, {'jid': jid}, with_timing=False)

    def v2_runner_on_async_poll(self, result):
        with _guard(self, 'v2_runner_on_async_poll'):
            self._async_event('runner_on_async_poll', result)

    def v2_runner_on_async_ok(self, result):
        with _guard(self, 'v2_runner_on_async_ok'):
            self._async_event('runner_on_async_ok', result)

    def v2_runner_on_async_failed(self, result):
        with _guard(self, 'v2_runner_on_async_failed'):
            self._async_event('runner_on_async_failed', result)

    def v2_on_file_diff(self, result):
        with _guard(self, 'v2_on_file_diff'):
            res = _censor_result(result)
            diff = res.get('diff') if isinstance(res, Mapping) else None
            if diff is None:
                return
            task = _task_of(result)
            data = {'host': _host_of(result).get_name(), 'diff': diff}
            self._emit('runner_on_file_diff', self._context(data, task=task), parent_uuid=self._task_parent(task))

    def v2_playbook_on_notify(self, handler, host):
        with _guard(self, 'v2_playbook_on_notify'):
            data = {'host': host.get_name(), 'handler': handler.get_name()}
            self._emit('playbook_on_notify', self._context(data), parent_uuid=self._current_parent())

    def v2_playbook_on_include(self, included_file):
        with _guard(self, 'v2_playbook_on_include'):
            data = {
                'included_file': getattr(included_file, '_filename', None),
                'hosts': [h.get_name() for h in getattr(included_file, '_hosts', None) or []],
            }
            self._emit('playbook_on_include', self._context(data), parent_uuid=self._current_parent())

    def v2_playbook_on_no_hosts_matched(self):
        with _guard(self, 'v2_playbook_on_no_hosts_matched'):
            self._emit('playbook_on_no_hosts_matched', self._context({}), parent_uuid=self._play_event_uuid or self._playbook_uuid)

    def v2_playbook_on_no_hosts_remaining(self):
        with _guard(self, 'v2_playbook_on_no_hosts_remaining'):
            self._emit('playbook_on_no_hosts_remaining', self._context({}), parent_uuid=self._play_event_uuid or self._playbook_uuid)

    def v2_playbook_on_vars_prompt(self, varname, private=True, prompt=None, *args, **kwargs):
        # The default answer may be a password: only the question is reported.
        with _guard(self, 'v2_playbook_on_vars_prompt'):
            data = {'varname': varname, 'private': private, 'prompt': prompt}
            self._emit('playbook_on_vars_prompt', self._context(data), parent_uuid=self._play_event_uuid or self._playbook_uuid)

    def v2_playbook_on_stats(self, stats):
        with _guard(self, 'v2_playbook_on_stats'):
            self._play = None
            self._task = None
            custom = getattr(stats, 'custom', None) or {}
            data = {
                'ok': getattr(stats, 'ok', {}),
                'changed': getattr(stats, 'changed', {}),
                'failures': getattr(stats, 'failures', {}),
                'dark': getattr(stats, 'dark', {}),
                'skipped': getattr(stats, 'skipped', {}),
                'rescued': getattr(stats, 'rescued', {}),
                'ignored': getattr(stats, 'ignored', {}),
                'processed': getattr(stats, 'processed', {}),
                'artifact_data': custom.get('_run', {}) if isinstance(custom, Mapping) else {},
            }
            self._emit('playbook_on_stats', self._context(data), parent_uuid=self._playbook_uuid)


def _task_fields(task):
    fields = {
        'task': str(getattr(task, 'name', None) or getattr(task, 'action', '') or ''),
        'task_uuid': str(task._uuid),
        'task_action': getattr(task, 'action', None),
        'resolved_action': getattr(task, 'resolved_action', None) or getattr(task, 'action', None),
        # Arguments can hold passwords; ansible-runner leaves them out by default as well.
        'task_args': '',
        'task_path': None,
    }
    try:
        fields['task_path'] = task.get_path()
    except Exception:
        pass
    role = getattr(task, '_role', None)
    if role is not None:
        fields['role'] = getattr(role, '_role_name', None)
    return fields


# ansible-core 2.19 made a result's host, task and result dict public and deprecated the
# underscored names that 2.14 has only; prefer the public ones where they exist.
def _host_of(result):
    host = getattr(result, 'host', None)
    return host if host is not None else result._host


def _task_of(result):
    task = getattr(result, 'task', None)
    return task if task is not None else result._task


def _res_of(result):
    res = getattr(result, 'result', None)
    return res if res is not None else getattr(result, '_result', None)


def _remote_addr(host):
    # Where ansible connects: the inventory's ansible_host when it is a plain value (a template
    # would mean nothing to a reader), else Host.address, which is often just the host's name.
    addr = None
    try:
        addr = host.vars.get('ansible_host')
    except Exception:
        pass
    if isinstance(addr, str) and addr and '{{' not in addr and '{%' not in addr:
        return str(addr)
    return getattr(host, 'address', None)


def _changed(result):
    try:
        return bool(result.is_changed())
    except Exception:
        res = _res_of(result)
        return bool(isinstance(res, Mapping) and res.get('changed'))


def _bounded_text(err, limit=1024):
    text = str(err)
    return text if len(text) <= limit else text[:limit] + '...'


class _guard:
    """Context manager that turns an exception in a callback into a warning event."""

    def __init__(self, plugin, method):
        self._plugin = plugin
        self._method = method

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None or not issubclass(exc_type, Exception):
            return False
        try:
            self._plugin._report(self._method, exc)
        except Exception:
            pass
        return True
