;;; eglot_complete.el --- drive eglot's completion against llada-lsp in batch mode  -*- lexical-binding: t -*-

;; Used by test_emacs.py: emacs --batch -Q -l eglot_complete.el
;; Inputs (environment):
;;   LLADA_EMACS_SERVER  the server command, a JSON array of strings
;;   LLADA_EMACS_FILE    the Python file to open
;;   LLADA_EMACS_LINE    the 1-based line to complete on; the cursor goes to its end
;;   LLADA_EMACS_TIMEOUT seconds allowed for each wait (server start, completion request)
;; Output: one line `@@LLADA-RESULT@@ JSON` on stdout with the eglot version, the candidates eglot
;; offered, the line after `completion-at-point', and how the server process ended.

(require 'cl-lib)
(require 'json)
(require 'subr-x)

(load (expand-file-name "emacs_packages.el" (file-name-directory load-file-name)) nil t)
(require 'eglot)
(require 'python)

(defun llada--emit (result)
  ;; On its own line: a failed completion rings the bell, which batch Emacs writes to stdout.
  (princ (concat "\n@@LLADA-RESULT@@ " (json-encode result) "\n")))

(let* ((server-cmd (append (json-read-from-string (getenv "LLADA_EMACS_SERVER")) nil))
       (file (getenv "LLADA_EMACS_FILE"))
       (line (string-to-number (getenv "LLADA_EMACS_LINE")))
       (timeout (string-to-number (or (getenv "LLADA_EMACS_TIMEOUT") "45")))
       (eglot-version (or (when-let ((v (alist-get 'eglot package--builtin-versions)))  ; Emacs 29+
                            (mapconcat #'number-to-string v "."))
                          (ignore-errors
                            (with-temp-buffer
                              (insert-file-contents (locate-library "eglot.el"))
                              (and (re-search-forward "^;; Version: *\\([0-9.]+\\)" nil t)
                                   (match-string 1))))
                          "unknown"))
       (result (list (cons 'emacs emacs-version) (cons 'eglot eglot-version)))
       server proc)
  (setq eglot-server-programs (list (cons 'python-mode server-cmd))
        ;; The model loads in the background; the sync requests may wait for it.
        eglot-sync-connect timeout
        eglot-connect-timeout timeout
        jsonrpc-default-request-timeout timeout
        eglot-autoshutdown nil
        eglot-events-buffer-size 0
        ring-bell-function #'ignore)
  (condition-case err
      (progn
        (find-file file)
        (python-mode)
        (call-interactively #'eglot)
        (setq server (eglot-current-server))
        (unless server (error "eglot did not connect"))
        (setq proc (jsonrpc--process server))
        (push (cons 'capabilities (eglot--server-capable :completionProvider)) result)
        ;; The model loads in the background: a completion asked while it loads rightly gets nothing at
        ;; once (isIncomplete), so wait until the server says it is ready.
        (let ((deadline (+ (float-time) timeout)))
          (while (not (equal "ready" (plist-get (jsonrpc-request server :workspace/executeCommand
                                                                 '(:command "llada.status"))
                                                :state)))
            (when (> (float-time) deadline) (error "the model did not load within %s s" timeout))
            (sleep-for 0.2)))
        ;; The cursor right after the partial word at the end of LINE.
        (goto-char (point-min))
        (forward-line (1- line))
        (end-of-line)
        (push (cons 'before (buffer-substring-no-properties (line-beginning-position) (point))) result)
        ;; What eglot's completion table offers for the word typed (its all-completions).
        (let* ((capf (eglot-completion-at-point))
               (beg (nth 0 capf)) (end (nth 1 capf)) (table (nth 2 capf)))
          (push (cons 'probe (buffer-substring-no-properties beg end)) result)
          (push (cons 'candidates
                      (vconcat (mapcar #'substring-no-properties
                                       (all-completions (buffer-substring-no-properties beg end)
                                                        table))))
                result))
        ;; What eglot inserts: the real command, with eglot's capf only.
        (let ((completion-at-point-functions '(eglot-completion-at-point)))
          (push (cons 'capf-return (format "%S" (completion-at-point))) result))
        (push (cons 'after (buffer-substring-no-properties (line-beginning-position) (line-end-position)))
              result)
        (push (cons 'point-column (current-column)) result)
        (push (cons 'buffer (buffer-substring-no-properties (point-min) (point-max))) result))
    (error (push (cons 'error (error-message-string err)) result)))
  ;; Shut the server down the way eglot does; before jsonrpc-shutdown deletes the process (a SIGKILL
  ;; when it is still running), give it the time to exit on its own after `exit'.
  (when server
    (advice-add 'jsonrpc-shutdown :before
                (lambda (&rest _)
                  (with-timeout (10 nil)
                    (while (process-live-p proc)
                      (accept-process-output proc 0.05)))))
    (condition-case err
        (eglot-shutdown server)
      (error (push (cons 'shutdown-error (error-message-string err)) result)))
    (push (cons 'process-status (symbol-name (process-status proc))) result)
    (push (cons 'exit-status (process-exit-status proc)) result))
  (llada--emit result))

;;; eglot_complete.el ends here
