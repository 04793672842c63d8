;;; lsp_mode_session.el --- drive lsp-mode (and company) against llada-lsp in batch mode  -*- lexical-binding: t -*-

;; Used by test_emacs.py: emacs --batch -Q -l lsp_mode_session.el
;; Inputs (environment):
;;   LLADA_EMACS_SERVER   the server command, a JSON array of strings
;;   LLADA_EMACS_FILE     the Python file to open
;;   LLADA_EMACS_POINT    1-based LINE:COLUMN (0-based column) of the cursor for the completions
;;   LLADA_EMACS_REGION   LINE1:LINE2, the whole lines to rewrite through the code action (or empty)
;;   LLADA_EMACS_TIMEOUT  seconds allowed for each wait (server start, model load, each request)
;; Output: one line `@@LLADA-RESULT@@ JSON` on stdout: the lsp-mode and company versions, what
;; completion-at-point and company made of the line (the buffer put back in between), the code actions
;; offered for the region and the buffer after the rewrite one ran, and how the server ended.

(require 'cl-lib)
(require 'json)
(require 'subr-x)
(load (expand-file-name "emacs_packages.el" (file-name-directory load-file-name)) nil t)
(require 'lsp-mode)
(require 'lsp-completion)
(require 'company)
(require 'python)

(defun llada--emit (result)
  ;; On its own line: a failed completion rings the bell, which batch Emacs writes to stdout.
  (princ (concat "\n@@LLADA-RESULT@@ " (json-encode result) "\n")))

(defun llada--package (library)
  "The folder LIBRARY was loaded from, e.g. lsp-mode-8.0.0: packages name it after their version."
  (file-name-nondirectory (directory-file-name (file-name-directory (locate-library library)))))

(defun llada--wait (what timeout predicate)
  "Waits up to TIMEOUT seconds for PREDICATE, handling process output meanwhile; signals WHAT otherwise."
  (let ((deadline (+ (float-time) timeout)))
    (while (not (funcall predicate))
      (when (> (float-time) deadline)
        (error "Timed out after %ss waiting for %s" timeout what))
      (accept-process-output nil 0.05))))

(defun llada--goto (line column)
  (goto-char (point-min))
  (forward-line (1- line))
  (move-to-column column))

(defun llada--line ()
  (buffer-substring-no-properties (line-beginning-position) (line-end-position)))

(let* ((server-cmd (append (json-read-from-string (getenv "LLADA_EMACS_SERVER")) nil))
       (file (getenv "LLADA_EMACS_FILE"))
       (point-spec (mapcar #'string-to-number (split-string (getenv "LLADA_EMACS_POINT") ":")))
       (region-spec (mapcar #'string-to-number (split-string (or (getenv "LLADA_EMACS_REGION") "") ":" t)))
       (timeout (string-to-number (or (getenv "LLADA_EMACS_TIMEOUT") "45")))
       (result (list (cons 'emacs emacs-version) (cons 'lsp-mode (llada--package "lsp-mode"))
                     (cons 'company (llada--package "company"))))
       (root (file-name-directory file))
       workspace proc original)
  (setq lsp-session-file (expand-file-name "session" (make-temp-file "llada-lsp-mode" t))
        lsp-enabled-clients '(llada)
        lsp-auto-guess-root nil
        lsp-keep-workspace-alive nil
        lsp-restart 'ignore
        lsp-enable-file-watchers nil
        lsp-enable-snippet nil
        lsp-headerline-breadcrumb-enable nil
        lsp-modeline-code-actions-enable nil
        lsp-modeline-diagnostics-enable nil
        lsp-modeline-workspace-status-enable nil
        lsp-signature-auto-activate nil
        lsp-enable-symbol-highlighting nil
        lsp-lens-enable nil
        lsp-response-timeout timeout
        lsp-log-io nil
        ring-bell-function #'ignore)
  (lsp-register-client
   (make-lsp-client :new-connection (lsp-stdio-connection (lambda () server-cmd))
                    :major-modes '(python-mode)
                    :server-id 'llada))
  (condition-case err
      (progn
        (find-file file)
        (python-mode)
        (lsp-workspace-folders-add root)
        (lsp)
        (llada--wait "lsp-mode to initialize" timeout
                     (lambda ()
                       (when-let ((ws (car (lsp-workspaces))))
                         (eq (lsp--workspace-status ws) 'initialized))))
        (setq workspace (car (lsp-workspaces))
              proc (lsp--workspace-proc workspace)
              original (buffer-substring-no-properties (point-min) (point-max)))
        ;; The model loads in the background: completion asked while it loads may rightly get nothing.
        (llada--wait "the model to load" timeout
                     (lambda ()
                       (equal "ready" (gethash "state" (lsp-request "workspace/executeCommand"
                                                                    '(:command "llada.status"))))))
        (push (cons 'capabilities
                    (list (cons 'completion (and (lsp-feature? "textDocument/completion") t))
                          (cons 'codeAction (and (lsp-feature? "textDocument/codeAction") t))))
              result)

        ;; Plain completion-at-point with lsp-mode's function only.
        (apply #'llada--goto point-spec)
        (push (cons 'before (llada--line)) result)
        (let* ((capf (lsp-completion-at-point))
               (beg (nth 0 capf)) (end (nth 1 capf)) (table (nth 2 capf)))
          (push (cons 'capf-bounds (buffer-substring-no-properties beg end)) result)
          (push (cons 'candidates
                      (vconcat (mapcar #'substring-no-properties
                                       (all-completions (buffer-substring-no-properties beg (point)) table))))
                result))
        (let ((completion-at-point-functions '(lsp-completion-at-point)))
          (condition-case capf-err (completion-at-point)
            (error (push (cons 'capf-error (error-message-string capf-err)) result))))
        (push (cons 'capf-after (llada--line)) result)
        (push (cons 'capf-buffer (buffer-substring-no-properties (point-min) (point-max))) result)

        ;; The same with company's completion-at-point backend, the buffer put back first.
        (erase-buffer)
        (insert original)
        (apply #'llada--goto point-spec)
        (setq-local company-backends '(company-capf)
                    company-minimum-prefix-length 0
                    company-idle-delay nil)
        (setq-local completion-at-point-functions '(lsp-completion-at-point))
        (company-mode 1)
        (condition-case company-err
            (progn
              (company-manual-begin)
              (push (cons 'company-candidates (vconcat (mapcar #'substring-no-properties company-candidates)))
                    result)
              (when company-candidates
                (company-complete-selection)))
          (error (push (cons 'company-error (error-message-string company-err)) result)))
        (push (cons 'company-after (llada--line)) result)
        (push (cons 'company-buffer (buffer-substring-no-properties (point-min) (point-max))) result)
        (company-mode -1)

        ;; The rewrite through the code action, on whole lines, the buffer put back first.
        (when region-spec
          (condition-case rewrite-err
              (progn
                (erase-buffer)
                (insert original)
                (transient-mark-mode 1)
                (llada--goto (nth 0 region-spec) 0)
                (push-mark (point) t t)
                (llada--goto (1+ (nth 1 region-spec)) 0)
                (let* ((actions (lsp-code-actions-at-point))
                       (rewrite (cl-find "Rewrite selection (LLaDA)" actions
                                         :key (lambda (a) (lsp:code-action-title a)) :test #'equal)))
                  (push (cons 'code-actions
                              (vconcat (mapcar (lambda (a) (list (cons 'title (lsp:code-action-title a))
                                                                 (cons 'kind (lsp:code-action-kind? a))))
                                               actions)))
                        result)
                  (when rewrite
                    (deactivate-mark)
                    (lsp-execute-code-action rewrite)
                    (push (cons 'rewrite-buffer (buffer-substring-no-properties (point-min) (point-max)))
                          result))))
            (error (push (cons 'rewrite-error (error-message-string rewrite-err)) result)))))
    (error (push (cons 'error (error-message-string err)) result)))
  (when workspace
    (set-buffer-modified-p nil)
    (condition-case err
        (progn
          (lsp-workspace-shutdown workspace)
          (llada--wait "the server to exit" 15 (lambda () (not (process-live-p proc)))))
      (error (push (cons 'shutdown-error (error-message-string err)) result)))
    (push (cons 'process-status (symbol-name (process-status proc))) result)
    (push (cons 'exit-status (process-exit-status proc)) result))
  (llada--emit result))

;;; lsp_mode_session.el ends here
